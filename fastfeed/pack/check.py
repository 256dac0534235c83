"""Prove one image file decodes and decide what its record holds; no one file can stop the pack.

A record holds the source bytes when both `fastfeed.codec` and NVIDIA DALI decode them
(`formats.STORABLE`: JPEG, PNG, BMP, TIFF, WebP, JPEG 2000, PNM). Any other format that an
installed library decodes is decoded here and stored as PNG (a `transcoded` note); one that
nothing installed decodes is `unsupported_format`, naming what to install. An image over
--max-pixels is refused from its header, before anything is decoded.

Failures the decoders report (`codec.DecodeError`) reject the file as `corrupt_image`; any other
exception while checking it rejects it as `check_failed` with the exception's type and message,
and is logged with its traceback: unexpected, so it is named rather than hidden.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from .. import codec, exif, formats
from .report import Problem

log = logging.getLogger(__name__)

# Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS): 1024 * 1024 * 1024 // 4 // 3.
DEFAULT_MAX_PIXELS = 89_478_485


@dataclass(slots=True)
class Checked:
    """What the record of a good image holds."""

    orig: tuple[int, int]                 # (h, w) of the source image in the frame its boxes are in
    size: tuple[int, int]                 # (h, w) of the stored image, in that frame
    codec: str                            # the record's codec: 'jpeg' | 'cv2' | 'raw' (or the --store mode)
    payload: bytes | None = None          # --store original: the source bytes, or PNG for a transcoded image
    pixels: np.ndarray | None = None      # --store jpeg/raw: RGB fitted to --max-side
    notes: list[Problem] = field(default_factory=list)
    orientation: int = 1                  # what Record.decode applies to the payload (exif.payload_orientation)
    tag: int = 1                          # the file's EXIF orientation tag


class _TooLarge(Exception):
    pass


def _conversion_notes(data, fmt: str, name: str) -> list[Problem]:
    container, colour, bits = codec.describe(data)
    notes = [] if container == "jpeg" else [Problem("converted_format", name, fmt)]
    if colour in ("grayscale", "cmyk", "rgba"):
        notes.append(Problem(f"converted_{colour}", name))
    if bits == 16:
        notes.append(Problem("converted_16bit", name))
    return notes


def _limit(hw, max_pixels: int, when: str) -> None:
    h, w = hw
    if h * w > max_pixels:
        raise _TooLarge(f"{w}x{h} = {h * w / 1e6:.1f} MP ({when}) is over --max-pixels {max_pixels} "
                        f"({max_pixels / 1e6:.1f} MP); raise --max-pixels if the image is genuine")


_SAME_SIZE = {2: "mirrored", 3: "upside down", 4: "mirrored upside down"}


def _orientation_detail(tag: int, mode: str) -> str:
    """The note's detail; for the orientations that keep the image's size (2-4) under --exif apply, plainly
    which frame the boxes were taken in, and when --exif ignore is right (nothing in the file can tell)."""
    if mode != "apply" or tag not in _SAME_SIZE:
        return f"EXIF orientation {tag}"
    return (f"EXIF orientation {tag} ({_SAME_SIZE[tag]}, the same size in both frames): its boxes were taken in the "
            "upright frame, as labelling tools and Ultralytics show the image; if they were drawn on the raw, "
            "unturned pixels (some COCO exports), pack with --exif ignore")


def _check(data, name: str, cfg) -> Checked:
    fmt = formats.image_format(data)
    hw = formats.header_size(data, fmt)
    if hw is not None:
        _limit(hw, cfg.max_pixels, "from the header, not decoded")
    if fmt == "tiff" and formats.is_float_tiff(data):
        raise formats.UnsupportedFormat("32-bit float TIFF: OpenCV does not decode float samples to 8-bit "
                                        "colour; convert it to an 8- or 16-bit TIFF or PNG")
    if fmt in formats.STORABLE:
        notes = _conversion_notes(data, fmt, name)
        tag = exif.exif_orientation(data)
        turn = exif.payload_orientation(data, tag, cfg.exif == "apply")
        if tag != 1:
            notes.append(Problem("oriented" if cfg.exif == "apply" else "orientation_ignored", name,
                                 _orientation_detail(tag, cfg.exif)))
        if cfg.store == "original":   # the source bytes, and the turn that Record.decode applies to them
            size, how = codec.check_decodable(data, full=cfg.check == "full")
            if hw is None:
                _limit(size, cfg.max_pixels, "decoded")
            size = exif.oriented_size(*size, turn)
            return Checked(size, size, how, payload=data, notes=notes, orientation=turn, tag=tag)
        img, orig, how = codec.decode_fit(data, cfg.max_side)   # jpeg/raw: the pixels are stored turned
        _limit(orig, cfg.max_pixels, "decoded")
        img = exif.apply_orientation(img, turn)
        return Checked(exif.oriented_size(*orig, turn), img.shape[:2], cfg.store, pixels=img, notes=notes, tag=tag)
    img, decoder = formats.decode_other(data, fmt)
    orig = img.shape[:2]
    _limit(orig, cfg.max_pixels, "decoded")
    if cfg.store == "original":
        note = Problem("transcoded", name, f"{fmt} decoded by {decoder}, stored as PNG")
        return Checked(orig, orig, "cv2", payload=formats.encode_png(img), notes=[note])
    img = codec.resize_to(img, codec.fit_size(*orig, cfg.max_side))
    note = Problem("transcoded", name, f"{fmt} decoded by {decoder}")
    return Checked(orig, img.shape[:2], cfg.store, pixels=img, notes=[note])


def check_image(data, name: str, cfg) -> tuple[Checked | None, Problem | None]:
    """(what the record holds, None) for a good image; (None, the rejection) for any other."""
    try:
        return _check(data, name, cfg), None
    except formats.UnsupportedFormat as e:
        reason, err = "unsupported_format", e
    except (_TooLarge, MemoryError) as e:
        reason, err = "image_too_large", e
    except codec.DecodeError as e:
        reason, err = "corrupt_image", e
    except Exception as e:  # anything else on one file is that file's rejection, named, never the pack's end
        log.warning("unexpected error while checking %s", name, exc_info=True)
        reason, err = "check_failed", e
    own = isinstance(err, (_TooLarge, formats.UnsupportedFormat))  # messages written for the user as they are
    return None, Problem(reason, name, (str(err) if own else f"{type(err).__name__}: {err}")[:300])
