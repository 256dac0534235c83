"""EXIF orientation: reading the tag from a file's header (pack time) and the two steps that turn a
decoded image upright (read time). The one definition: `codec.decode_payload`, the DALI graph and the
torch device loader all apply `orientation_steps`.
"""

from __future__ import annotations

import struct

import cv2
import numpy as np

# Tag 0x0112: how the stored pixels must be turned to be shown upright. 1: as stored; 2: mirrored;
# 3: turned 180; 4: flipped upside down; 5: transposed; 6: turned 90 clockwise; 7: transverse;
# 8: turned 90 anticlockwise. 5..8 swap height and width.

def oriented_size(h: int, w: int, orientation: int) -> tuple[int, int]:
    """(h, w) of an h x w stored image once shown upright."""
    return (w, h) if orientation >= 5 else (h, w)


_STEPS = {1: (False, 0), 2: (True, 0), 3: (False, 180), 4: (True, 180),
          5: (True, 90), 6: (False, 270), 7: (True, 270), 8: (False, 90)}
_CV2_TURN = {90: cv2.ROTATE_90_COUNTERCLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_CLOCKWISE}


def orientation_steps(orientation: int) -> tuple[bool, int]:
    """(mirror left-right first?, then turn anticlockwise by this many degrees) for orientation 1..8."""
    if orientation not in _STEPS:
        raise ValueError(f"EXIF orientation must be 1..8, got {orientation!r}")
    return _STEPS[orientation]


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """The upright image (a new array, or `img` itself for orientation 1)."""
    mirror, turn = orientation_steps(orientation)
    if mirror:
        img = cv2.flip(img, 1)
    if turn:
        img = cv2.rotate(img, _CV2_TURN[turn])
    return img


def exif_orientation(data) -> int:
    """The EXIF orientation (1..8) of a JPEG (APP1 Exif), PNG (eXIf chunk), WebP (EXIF chunk) or TIFF,
    read from the container without decoding; 1 when there is none or it cannot be read (as Pillow's
    exif_transpose then leaves the image)."""
    head = bytes(data[:12])
    try:
        if head.startswith(b"\xff\xd8"):
            tiff = _jpeg_exif(data)
        elif head.startswith(b"\x89PNG\r\n\x1a\n"):
            tiff = _chunk(data, png=True)
        elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            tiff = _chunk(data, png=False)
        elif head[:4] in (b"II*\x00", b"MM\x00*"):
            tiff = data
        else:
            return 1
        if tiff is None or bytes(tiff[:2]) not in (b"II", b"MM"):
            return 1
        value = tiff_tags(memoryview(tiff)).get(0x0112)
        return value if value is not None and 1 <= value <= 8 else 1
    except (struct.error, IndexError, ValueError):
        return 1


_INVERSE = {6: 8, 8: 6}   # every other orientation is its own inverse


def payload_orientation(data, tag: int, apply: bool) -> int:
    """The orientation a record keeps for these bytes: what `decode_payload` must apply to their decode
    so the pixels are in the frame the boxes are in. `apply`: boxes in the upright frame (the EXIF
    tag `tag` applied: `fastfeed pack --exif apply`), else in the stored frame (`--exif ignore`).
    OpenCV turns a TIFF upright itself (IMREAD_IGNORE_ORIENTATION or not), so a TIFF needs nothing
    more to be upright, and the inverse turn to be in its stored frame."""
    turned_by_decoder = bytes(data[:4]) in (b"II*\x00", b"MM\x00*")
    if apply:
        return 1 if turned_by_decoder else tag
    return _INVERSE.get(tag, tag) if turned_by_decoder else 1


def _jpeg_exif(data):
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:                        # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in (0xDA, 0xD9):                # start of scan / end of image: no EXIF before it
            return None
        length = struct.unpack_from(">H", data, i + 2)[0]
        if marker == 0xE1 and bytes(data[i + 4:i + 10]) == b"Exif\x00\x00":
            return data[i + 10:i + 2 + length]
        i += 2 + length
    return None


def _chunk(data, png: bool):
    """The EXIF chunk of a PNG (`eXIf`, after its 8-byte signature: length, kind, data, CRC) or a WebP (`EXIF`, after
    its 12-byte RIFF header: kind, little-endian length, data padded to even; maybe with JPEG's Exif header)."""
    i, n = (8, len(data)) if png else (12, len(data))
    while i + 8 <= n:
        length, kind = struct.unpack_from(">I4s", data, i) if png else struct.unpack_from("<4sI", data, i)[::-1]
        if kind == (b"eXIf" if png else b"EXIF"):
            chunk = data[i + 8:i + 8 + length]
            return chunk[6:] if bytes(chunk[:6]) == b"Exif\x00\x00" else chunk
        if kind == b"IEND":
            return None
        i += 12 + length if png else 8 + length + (length & 1)
    return None


def tiff_tags(data) -> dict[int, int | None]:
    """IFD0's tags of a classic TIFF structure (a TIFF file, or an EXIF block), each with its first value
    when it is a SHORT or LONG. Raises struct.error when the structure is truncated or damaged."""
    order = "<" if bytes(data[:2]) == b"II" else ">"
    (offset,) = struct.unpack_from(order + "I", data, 4)
    (count,) = struct.unpack_from(order + "H", data, offset)
    tags = {}
    for k in range(count):
        tag, kind, n, raw = struct.unpack_from(order + "HHI4s", data, offset + 2 + 12 * k)
        value = None
        if kind in (3, 4):  # SHORT, LONG: inline when they fit in 4 bytes, else at an offset
            fmt, size = ("H", 2) if kind == 3 else ("I", 4)
            if n * size <= 4:
                value = struct.unpack_from(order + fmt, raw)[0]
            else:
                value = struct.unpack_from(order + fmt, data, struct.unpack(order + "I", raw)[0])[0]
        tags[tag] = value
    return tags
