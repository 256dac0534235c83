"""The on-disk format of a fastfeed store: the one place that knows keys, layouts and the version.

A store is a directory::

    manifest.json          what is in the store (see docs/format.md)
    shard-00000.mdb ...    LMDB files (subdir=False), one record per image
    rejects.jsonl          what the packer skipped, and why (may be empty)

Record layout (little-endian), CRC32 over every byte after the CRC field::

    header   HEADER struct below
    name     UTF-8 source file name, `name_len` bytes
    boxes    float32 [n_boxes + n_crowd, 4]  x1, y1, x2, y2 normalised to 0..1 of the image
    classes  int32   [n_boxes + n_crowd]     contiguous class ids 0..C-1
    payload  JPEG bytes (codec jpeg), other encoded image bytes such as PNG (codec cv2),
             or raw uint8 HWC RGB pixels (codec raw, height * width * 3)

Training boxes come first, then the `iscrowd` boxes (kept for evaluation, never trained on).
Normalised coordinates make boxes independent of any resize of the payload.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:  # the same CRC-32 as zlib's, computed with carry-less multiplication: ~7x faster
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; stay readable without it
    from zlib import crc32

FORMAT_NAME = "fastfeed"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
MAGIC = b"FFR1"

CODECS = ("jpeg", "cv2", "raw")  # cv2: any other encoded format, decoded by OpenCV
_CODEC_ID = {name: i for i, name in enumerate(CODECS)}

# magic, crc32, codec, channels, reserved, height, width, orig_h, orig_w, image_id, n_boxes, n_crowd, name_len
HEADER = struct.Struct("<4sIBBHIIIIqIIH")
_CRC_FROM = 8  # the CRC covers everything after magic and the CRC itself


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.mdb"


def record_key(local: int) -> bytes:
    """Key of the `local`-th record of a shard (global index minus the shard's start).

    Shard-relative, so shards can be written in parallel before their global offsets are known;
    big-endian, so LMDB's key order is record order and appends are cheap."""
    return local.to_bytes(8, "big")


def pack_lock_path(out) -> Path:
    """The lock file of a pack into store `out`: `.OUT.lock` beside it. A running `fastfeed pack`
    holds an exclusive flock on it (its pid inside) from start to end and removes it when done; a
    leftover file nobody has locked is stale (a killed pack) and means nothing."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


class FormatError(ValueError):
    """A store or record that this version of fastfeed cannot read."""


class RecordCorrupt(FormatError):
    """A record whose CRC or layout does not check out."""


@dataclass(frozen=True, slots=True)
class RecordHeader:
    codec: str
    height: int
    width: int
    orig_height: int
    orig_width: int
    image_id: int
    n_boxes: int
    n_crowd: int
    name_len: int


def encode_record(*, codec: str, height: int, width: int, orig_height: int, orig_width: int,
                  image_id: int, file_name: str, boxes: np.ndarray, classes: np.ndarray,
                  crowd_boxes: np.ndarray, crowd_classes: np.ndarray, payload: bytes) -> bytes:
    name = file_name.encode("utf-8")
    if len(name) > 0xFFFF:
        raise FormatError(f"file name longer than 65535 bytes: {file_name[:80]}...")
    all_boxes = np.concatenate([boxes, crowd_boxes]).astype("<f4", copy=False).reshape(-1, 4)
    all_classes = np.concatenate([classes, crowd_classes]).astype("<i4", copy=False)
    head = HEADER.pack(MAGIC, 0, _CODEC_ID[codec], 3, 0, height, width, orig_height, orig_width,
                       image_id, len(boxes), len(crowd_boxes), len(name))
    body = b"".join([head[_CRC_FROM:], name, all_boxes.tobytes(), all_classes.tobytes()])
    return b"".join([MAGIC, struct.pack("<I", crc32(payload, crc32(body))), body, payload])


def check_crc(buf) -> bool:
    return len(buf) >= HEADER.size and crc32(memoryview(buf)[_CRC_FROM:]) == struct.unpack_from("<I", buf, 4)[0]


def decode_record(buf, check: bool = True):
    """Split a record into (header, name, boxes, classes, payload view).

    `buf` may be a memoryview into the LMDB map; the payload returned is a view of it.
    Raises RecordCorrupt when the magic, layout or (with `check`) the CRC is wrong.
    """
    if len(buf) < HEADER.size or bytes(buf[:4]) != MAGIC:
        raise RecordCorrupt("bad record magic (not a fastfeed record, or damaged)")
    if check and not check_crc(buf):
        raise RecordCorrupt("CRC32 mismatch")
    (_, _, codec_id, _, _, h, w, oh, ow, image_id, nb, nc, nl) = HEADER.unpack_from(buf, 0)
    if codec_id >= len(CODECS):
        raise RecordCorrupt(f"unknown codec id {codec_id}")
    head = RecordHeader(CODECS[codec_id], h, w, oh, ow, image_id, nb, nc, nl)
    off = HEADER.size
    name = bytes(buf[off:off + nl]).decode("utf-8")
    off += nl
    n = nb + nc
    boxes = np.frombuffer(buf, "<f4", n * 4, off).reshape(n, 4).astype(np.float32)
    off += n * 16
    classes = np.frombuffer(buf, "<i4", n, off).astype(np.int64)
    off += n * 4
    payload = buf[off:]
    if codec_id == _CODEC_ID["raw"] and len(payload) != h * w * 3:
        raise RecordCorrupt(f"raw payload of {len(payload)} bytes, expected {h}x{w}x3")
    return head, name, boxes, classes, payload


# --- manifest -------------------------------------------------------------------------------------

def write_manifest(path, manifest: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


def read_manifest(path) -> dict:
    """Load and version-check a manifest; errors say what the file is and what to do."""
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except FileNotFoundError:
        raise FormatError(f"{path} not found: not a fastfeed store (create one with `fastfeed pack`)") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{path} is not valid JSON ({e}); the store is damaged, re-run `fastfeed pack`") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise FormatError(f"{path} is not a fastfeed manifest")
    version = m.get("format_version")
    if version != FORMAT_VERSION:
        raise FormatError(f"store format version {version} but this fastfeed reads version {FORMAT_VERSION}: "
                          "re-pack the dataset with this fastfeed, or use the fastfeed release that wrote it")
    return m
