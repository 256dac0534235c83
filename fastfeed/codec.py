"""Image decoding and encoding shared by the packer, the store and the loaders: the one place that decides how bytes
become RGB pixels, so a record that passed the pack-time check decodes the same way at training time. JPEGs go
through libjpeg-turbo (simplejpeg) with DCT-domain downscaling, the rest through OpenCV; no decoder here applies an
EXIF orientation: `decode_payload` does, the record's (docs/design.md, "DCT-scaled JPEG decode", "EXIF orientation
is data, applied in one place").
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import simplejpeg

from .exif import apply_orientation

JPEG_MAGIC = b"\xff\xd8"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# cv2 would otherwise rotate by EXIF and silently disagree with simplejpeg and the annotations.
_CV2_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


class DecodeError(ValueError):
    """The bytes are not an image this codec can decode completely."""


def sniff(data) -> str:
    """Container type from the magic bytes: 'jpeg', 'png' or 'other'."""
    head = bytes(data[:8])
    return "jpeg" if head.startswith(JPEG_MAGIC) else "png" if head.startswith(PNG_MAGIC) else "other"


def jpeg_header(data) -> tuple[int, int, str]:
    """(height, width, colorspace) of a JPEG without decoding it."""
    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise DecodeError(f"bad JPEG header: {e}") from None
    return h, w, colorspace


def decode_jpeg(data, min_size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode a JPEG to RGB uint8 HWC, strictly (a truncated file raises).

    With `min_size=(h, w)` libjpeg-turbo scales in the DCT domain by the smallest factor k/8
    (k = 1..8) that keeps the result at least that large (sizes rounded up; see `dct_size`): far
    fewer pixels to produce.
    """
    mh, mw = min_size if min_size else (0, 0)
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=mh, min_width=mw, strict=True)
    except ValueError as e:
        raise DecodeError(f"JPEG decode failed: {e}") from None


def decode_cv2(data) -> np.ndarray:
    """Decode any format OpenCV knows (PNG, BMP, WebP, CMYK JPEG...) to RGB uint8 HWC."""
    if len(data) == 0:
        raise DecodeError("empty file (0 bytes)")  # cv2.imdecode asserts on an empty buffer
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), _CV2_FLAGS)
    except cv2.error as e:  # odd files (some TIFFs) make a decoder assert instead of returning None
        raise DecodeError(f"OpenCV: {str(e).strip()[:200]}") from None
    if img is None:
        raise DecodeError("OpenCV could not decode the image (corrupt, truncated or unknown format)")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def decode_any(data, min_size: tuple[int, int] | None = None) -> tuple[np.ndarray, str]:
    """Decode bytes of any supported format to RGB; returns (image, codec).

    codec is 'jpeg' when libjpeg-turbo's fast path applies (`min_size` then allows DCT scaling),
    'cv2' for everything OpenCV decodes instead (PNG, BMP, WebP, CMYK JPEG...).
    """
    if sniff(data) == "jpeg" and jpeg_header(data)[2] not in ("CMYK", "YCCK"):
        return decode_jpeg(data, min_size), "jpeg"
    return decode_cv2(data), "cv2"


def dct_size(h: int, w: int, min_size: tuple[int, int] | None) -> tuple[int, int]:
    """The (h, w) `decode_jpeg(data, min_size)` returns for an h x w JPEG: libjpeg-turbo's DCT scaling
    by k/8, k = 1..8, the smallest k whose ceil(h*k/8) x ceil(w*k/8) covers `min_size` (checked
    against simplejpeg in tests/test_codec.py)."""
    if not min_size:
        return h, w
    mh, mw = min_size
    for k in range(1, 8):
        sh, sw = math.ceil(h * k / 8), math.ceil(w * k / 8)
        if sh >= mh and sw >= mw:
            return sh, sw
    return h, w


def decode_payload(codec: str, payload, size: tuple[int, int], min_size: tuple[int, int] | None = None,
                   orientation: int = 1) -> np.ndarray:
    """A stored payload as upright RGB uint8 HWC: the one decode every reader uses.

    codec: 'jpeg' | 'cv2' | 'raw' (a record's); size: (h, w) of the upright image (a record's header).
    min_size (upright frame) lets a JPEG decode at a DCT-reduced scale no smaller than that.
    Raw payloads come back as a read-only view of `payload` (no copy); others as new arrays.
    """
    if codec == "raw":
        return np.frombuffer(payload, np.uint8).reshape(size[0], size[1], 3)
    if codec == "jpeg":
        if min_size and orientation >= 5:
            min_size = (min_size[1], min_size[0])
        img = decode_jpeg(payload, min_size)
    elif codec == "cv2":
        img = decode_cv2(payload)
    else:
        raise DecodeError(f"unknown payload codec {codec!r}")
    return apply_orientation(img, orientation)


def check_decodable(data, full: bool = False) -> tuple[tuple[int, int], str]:
    """Prove the image decodes; returns ((h, w), codec as in `decode_any`).

    For a JPEG the default check is a strict decode at 1/8 scale: libjpeg-turbo still parses every
    marker and entropy-decodes every coefficient (where truncation and corruption show), but skips
    most of the inverse DCT and colour conversion. It fails on exactly the inputs a full decode
    fails on (tests/test_codec.py corrupts real JPEGs to show it) at roughly half the cost.
    """
    if sniff(data) == "jpeg":
        h, w, colorspace = jpeg_header(data)
        if colorspace not in ("CMYK", "YCCK"):
            decode_jpeg(data, None if full else (1, 1))
            return (h, w), "jpeg"
    return decode_cv2(data).shape[:2], "cv2"


def describe(data) -> tuple[str, str, int]:
    """(container, colour, bits) read from the header only: what a decode to RGB will convert.

    container: 'jpeg' | 'png' | 'other'; colour: 'rgb' | 'grayscale' | 'cmyk' | 'rgba' | 'unknown'.
    """
    kind = sniff(data)
    if kind == "jpeg":
        colorspace = jpeg_header(data)[2]
        return kind, {"Gray": "grayscale", "CMYK": "cmyk", "YCCK": "cmyk"}.get(colorspace, "rgb"), 8
    if kind == "png" and len(data) >= 26 and bytes(data[12:16]) == b"IHDR":
        bits, colour_type = data[24], data[25]
        colour = {0: "grayscale", 4: "rgba", 6: "rgba"}.get(colour_type, "rgb")  # 4 = grey + alpha
        return kind, colour, bits
    return kind, "unknown", 8


def encode_jpeg(img: np.ndarray, quality: int) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorspace="RGB",
                                  colorsubsampling="420")


def fit_size(h: int, w: int, max_side: int | None) -> tuple[int, int]:
    """Size after shrinking so the long side is at most `max_side` (never enlarges)."""
    if not max_side or max(h, w) <= max_side:
        return h, w
    r = max_side / max(h, w)
    return max(1, round(h * r)), max(1, round(w * r))


def resize_to(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize to (h, w); area interpolation, which is what downscaling wants."""
    h, w = size
    if img.shape[:2] == (h, w):
        return img
    interp = cv2.INTER_AREA if h <= img.shape[0] else cv2.INTER_LINEAR
    return cv2.resize(img, (w, h), interpolation=interp)


def decode_fit(data, max_side: int | None) -> tuple[np.ndarray, tuple[int, int], str]:
    """Decode so the long side is at most `max_side`, using DCT scaling to skip most of the work.

    Returns (image, original (h, w), codec as in `decode_any`).
    """
    if max_side and sniff(data) == "jpeg":
        h, w, _ = jpeg_header(data)
        target = fit_size(h, w, max_side)
        img, how = decode_any(data, min_size=target)
        return resize_to(img, target), (h, w), how
    img, how = decode_any(data)
    orig = img.shape[:2]
    return resize_to(img, fit_size(*orig, max_side)), orig, how
