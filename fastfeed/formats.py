"""Image containers beyond the fast path: what a file is, its size from the header, and decoding the formats that a
record cannot hold as they are. Pack-time only: readers never come here. `STORABLE`: the containers both
`fastfeed.codec` and DALI decode; anything else is decoded by `decode_other` and stored as PNG, or raises
`UnsupportedFormat` naming the package to install (docs/inputs.md, "Image formats").
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import struct
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np

from .codec import DecodeError, decode_cv2, jpeg_header, sniff
from .exif import tiff_tags

STORABLE = frozenset({"jpeg", "png", "bmp", "tiff", "webp", "jp2", "pnm"})
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"}
_AVIF_BRANDS = {b"avif", b"avis"}
_TIFF_WIDTH, _TIFF_HEIGHT, _TIFF_SAMPLE_FORMAT, _DNG_VERSION = 256, 257, 339, 50706


class UnsupportedFormat(DecodeError):
    """A real image in a format or variant that nothing installed decodes; the message says what to do."""


def _tiff_tags(data) -> dict[int, int | None]:
    """IFD0's tags of a classic TIFF (`exif.tiff_tags`); a damaged header is a DecodeError."""
    try:
        return tiff_tags(data)
    except struct.error:
        raise DecodeError("TIFF header truncated or damaged") from None


def image_format(data) -> str:
    """The container from the magic bytes: 'jpeg', 'png', 'bmp', 'tiff', 'dng', 'webp', 'jp2',
    'pnm', 'pfm', 'gif', 'avif', 'heif', or 'unknown'. Extensions are not trusted."""
    head = bytes(data[:64])
    kind = sniff(head)
    if kind != "other":
        return kind
    if head[:4] in (b"II*\0", b"MM\0*"):
        return "dng" if _DNG_VERSION in _tiff_tags(data) else "tiff"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith((b"\0\0\0\x0cjP  \r\n\x87\n", b"\xff\x4f\xff\x51")):  # JP2 box, J2K codestream
        return "jp2"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if len(head) > 2 and head[:1] == b"P" and head[2:3].isspace():
        if head[1:2] in (b"F", b"f"):
            return "pfm"
        if head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6"):
            return "pnm"
    if head[4:8] == b"ftyp":  # ISO base media: the major brand, then the compatible brands
        end = min(len(head), int.from_bytes(head[:4], "big"))
        major, brands = head[8:12], {head[i:i + 4] for i in range(16, end - 3, 4)}
        if major in _AVIF_BRANDS or (major not in _HEIF_BRANDS - {b"mif1"} and brands & _AVIF_BRANDS):
            return "avif"
        if major in _HEIF_BRANDS or brands & _HEIF_BRANDS:
            return "heif"
    return "unknown"


@contextlib.contextmanager
def _pillow(fmt: str):
    """Pillow, with the plugin `fmt` needs registered when installed, and its decompression-bomb
    limit off: the packer compares sizes with --max-pixels itself (in its own worker processes)."""
    from PIL import Image

    _register_plugin(fmt)
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        yield Image
    finally:
        Image.MAX_IMAGE_PIXELS = limit


@functools.cache
def _register_plugin(fmt: str) -> None:
    with contextlib.suppress(ImportError):
        if fmt in ("heif", "unknown"):
            from pillow_heif import register_heif_opener

            register_heif_opener()
        if fmt in ("avif", "unknown"):
            import pillow_avif  # noqa: F401  (registers itself; Pillow >= 11.3 reads AVIF without it)


_PNM_SIZE = re.compile(rb"^P[1-6Ff](?:\s+|#[^\n]*\n)+(\d+)(?:\s+|#[^\n]*\n)+(\d+)")


def header_size(data, fmt: str) -> tuple[int, int] | None:
    """(height, width) from the header alone, or None where it does not say (the decoder's own
    limits then apply). Raises DecodeError on a header that is there but broken."""
    if fmt == "jpeg":
        return jpeg_header(data)[:2]
    if fmt == "png":
        if len(data) < 24 or bytes(data[12:16]) != b"IHDR":
            raise DecodeError("PNG without its IHDR header (truncated or damaged)")
        w, h = struct.unpack(">II", bytes(data[16:24]))
        return h, w
    if fmt in ("tiff", "dng"):
        tags = _tiff_tags(data)
        w, h = tags.get(_TIFF_WIDTH), tags.get(_TIFF_HEIGHT)
        return (h, w) if w and h else None
    if fmt in ("pnm", "pfm"):
        m = _PNM_SIZE.match(bytes(data[:512]))
        return (int(m[2]), int(m[1])) if m else None
    with _pillow(fmt) as Image:  # BMP, WebP, JP2, GIF, AVIF, HEIF: Pillow reads only the header here
        try:
            with Image.open(io.BytesIO(bytes(data))) as im:
                return im.size[1], im.size[0]
        except (OSError, SyntaxError, ValueError, EOFError, struct.error):
            return None


def is_float_tiff(data) -> bool:
    """32-bit float samples: OpenCV does not decode them to 8-bit colour."""
    return _tiff_tags(data).get(_TIFF_SAMPLE_FORMAT) == 3


_INSTALL = {
    "heif": "HEIC/HEIF image: install pillow-heif (pip install -e '.[heic]' in the fastfeed checkout) to pack it",
    "avif": "AVIF image that neither OpenCV nor Pillow here decodes: install pillow>=11.3 or pillow-avif-plugin",
    "dng": "DNG camera raw: install rawpy (pip install -e '.[raw]' in the fastfeed checkout) to develop it at pack time",
}


def _decode_pillow(data, fmt: str) -> np.ndarray:
    with _pillow(fmt) as Image:
        try:
            with Image.open(io.BytesIO(bytes(data))) as im:
                return np.asarray(im.convert("RGB"))
        except Image.UnidentifiedImageError:
            if fmt in _INSTALL:
                raise UnsupportedFormat(_INSTALL[fmt]) from None
            raise DecodeError("not an image format fastfeed recognises (OpenCV and Pillow cannot read it)") from None
        except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
            raise DecodeError(f"Pillow: {type(e).__name__}: {e}") from None


def _decode_pfm(data) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise DecodeError("OpenCV could not decode the PFM file (truncated or damaged)")
    lo, hi = (float(img.min()), float(img.max())) if img.size else (0.0, 0.0)
    if not (np.isfinite(img).all() and lo >= 0 and hi <= 1):
        raise UnsupportedFormat(f"PFM with values {lo:g}..{hi:g}: fastfeed reads 0..1 floats as 0..255 and does "
                                "not tone-map HDR; convert it to an 8- or 16-bit PNG")
    img = np.rint(img * 255).astype(np.uint8)
    return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB if img.ndim == 2 else cv2.COLOR_BGR2RGB)


def _decode_raw(data) -> np.ndarray:
    try:
        import rawpy
    except ImportError:
        raise UnsupportedFormat(_INSTALL["dng"]) from None
    def develop():  # LibRaw's defaults with the camera's white balance; pixels in sensor orientation, 8 bits
        try:
            with rawpy.imread(io.BytesIO(bytes(data))) as raw:
                return raw.postprocess(use_camera_wb=True, output_bps=8, user_flip=0)
        except (rawpy.LibRawError, OSError, ValueError) as e:
            raise DecodeError(f"rawpy: {type(e).__name__}: {e}") from None

    # LibRaw runs OpenMP loops. In a pack worker forked from a process that had used OpenMP (torch
    # does), the main thread's inherited OpenMP pool refers to threads that do not exist and its
    # first parallel loop waits forever; a thread started here gets a pool of its own.
    with ThreadPoolExecutor(1, thread_name_prefix="fastfeed-rawpy") as pool:
        return pool.submit(develop).result()


def decode_other(data, fmt: str) -> tuple[np.ndarray, str]:
    """Decode a container outside `STORABLE` to RGB uint8 HWC; returns (image, the decoder's name).

    Raises UnsupportedFormat (naming what to install) when nothing installed decodes it, and
    DecodeError when the file is damaged."""
    if fmt == "pfm":
        return _decode_pfm(data), "OpenCV"
    if fmt == "dng":
        return _decode_raw(data), "rawpy"
    if fmt in ("gif", "avif", "unknown"):  # OpenCV 5 here reads GIF and AVIF (and Sun raster, HDR...)
        try:
            return decode_cv2(data), "OpenCV"
        except DecodeError:
            if fmt == "gif" or not len(data):  # an empty file is nothing Pillow could read either
                raise
    return _decode_pillow(data, fmt), "Pillow"


def encode_png(img: np.ndarray) -> bytes:
    """RGB -> PNG, lossless; level 1 deflate (most of the size gain of 9 at a fraction of the time)."""
    ok, buf = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise DecodeError("OpenCV could not encode the decoded image as PNG")
    return buf.tobytes()
