"""The on-disk format of a fastfeed store: the one place that knows keys, layouts and the version.

A store is a directory::

    manifest.json          what is in the store (see docs/format.md)
    shard-00000.mdb ...    LMDB files (subdir=False), one record per image
    rejects.jsonl          what the packer skipped, and why (may be empty)

Record layout (little-endian), CRC32 over every byte after the CRC field::

    header   HEADER struct below (`orientation`: the EXIF orientation to apply when decoding, 1..8;
             format version 1 wrote 0 there, read as 1)
    name     UTF-8 source file name, `name_len` bytes
    boxes    float32 [n_boxes + n_crowd, 4]  x1, y1, x2, y2 normalised to 0..1 of the image
    classes  int32   [n_boxes + n_crowd]     contiguous class ids 0..C-1
    payload  JPEG bytes (codec jpeg), other encoded image bytes such as PNG (codec cv2),
             or raw uint8 HWC RGB pixels (codec raw, height * width * 3)

Training boxes come first, then the `iscrowd` boxes (kept for evaluation, never trained on).
Normalised coordinates make boxes independent of any resize of the payload. Height, width and the
boxes are those of the upright image: the payload decoded *and* turned by `orientation`.

Everything outside `fastfeed/store/` reads records through `Store.record(i) -> Record` and decodes
them with `Record.decode`; the byte layout is private to this package.
"""

from __future__ import annotations

import json
import struct
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .. import codec as _codec

try:  # the same CRC-32 as zlib's, computed with carry-less multiplication: ~7x faster
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; stay readable without it
    from zlib import crc32

FORMAT_NAME = "fastfeed"
FORMAT_VERSION = 3   # 2: the per-record EXIF orientation (version 1 reads as upright); 3: each shard's sha256
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
MAGIC = b"FFR1"

CODECS = ("jpeg", "cv2", "raw")  # cv2: any other encoded format, decoded by OpenCV
_CODEC_ID = {name: i for i, name in enumerate(CODECS)}

# magic, crc32, codec, channels, orientation, height, width, orig_h, orig_w, image_id, n_boxes, n_crowd, name_len
HEADER = struct.Struct("<4sIBBHIIIIqIIH")
_CRC_FROM = 8  # the CRC covers everything after magic and the CRC itself


def shard_file(index: int, pack_id: str | None = None) -> str:
    """Shard k's file name; in object storage with its pack's id, so a re-pack there writes new objects."""
    return f"shard-{pack_id}-{index:05d}.mdb" if pack_id else f"shard-{index:05d}.mdb"


def record_key(local: int) -> bytes:
    """Key of the `local`-th record of a shard (global index minus the shard's start).

    Shard-relative, so shards can be written in parallel before their global offsets are known;
    big-endian, so LMDB's key order is record order and appends are cheap."""
    return local.to_bytes(8, "big")


def pack_lock_path(out) -> Path:
    """The lock file of a pack into store `out`: `.OUT.lock` beside it. A running `fastfeed pack` holds an exclusive
    flock on it (its pid inside) and removes it when done; a leftover nobody has locked means nothing."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


class FormatError(ValueError):
    """A store or record that this version of fastfeed cannot read."""


class RecordCorrupt(FormatError):
    """A record whose CRC or layout does not check out."""


class StoreChanged(FormatError):
    """A shard changed on disk (truncated, overwritten) while a Store was reading it."""


def encode_record(*, codec: str, height: int, width: int, orig_height: int, orig_width: int,
                  image_id: int, file_name: str, boxes: np.ndarray, classes: np.ndarray,
                  crowd_boxes: np.ndarray, crowd_classes: np.ndarray, payload: bytes, orientation: int = 1) -> bytes:
    """One record's bytes. height/width/boxes: of the upright image; orientation: what turns the decoded
    payload upright (1 for pixels stored upright)."""
    name = file_name.encode("utf-8")
    if len(name) > 0xFFFF:
        raise FormatError(f"file name longer than 65535 bytes: {file_name[:80]}...")
    if not 1 <= orientation <= 8:
        raise FormatError(f"orientation must be 1..8, got {orientation}")
    all_boxes = np.concatenate([boxes, crowd_boxes]).astype("<f4", copy=False).reshape(-1, 4)
    all_classes = np.concatenate([classes, crowd_classes]).astype("<i4", copy=False)
    head = HEADER.pack(MAGIC, 0, _CODEC_ID[codec], 3, orientation, height, width, orig_height, orig_width,
                       image_id, len(boxes), len(crowd_boxes), len(name))
    body = b"".join([head[_CRC_FROM:], name, all_boxes.tobytes(), all_classes.tobytes()])
    return b"".join([MAGIC, struct.pack("<I", crc32(payload, crc32(body))), body, payload])


def record_crc(record: bytes) -> bytes:
    """The 4 CRC bytes of an encoded record (they cover all of its content: the store fingerprint uses them)."""
    return bytes(record[4:8])


def check_crc(buf) -> bool:
    return len(buf) >= HEADER.size and crc32(memoryview(buf)[_CRC_FROM:]) == struct.unpack_from("<I", buf, 4)[0]


@dataclass(slots=True)
class Record:
    """One record, parsed but not decoded: labels as arrays, `payload` a view into the shard's map
    (valid while its Store is open). `height`, `width` and the boxes are the upright image's."""

    index: int
    shard: str
    codec: str                  # 'jpeg' | 'cv2' | 'raw'
    height: int
    width: int
    orig_height: int
    orig_width: int
    orientation: int            # EXIF orientation the decode applies (1: stored upright)
    image_id: int
    file_name: str
    boxes: np.ndarray           # float32 [N,4] x1,y1,x2,y2 normalised 0..1 (training boxes)
    classes: np.ndarray         # int64 [N]
    crowd_boxes: np.ndarray     # float32 [K,4] iscrowd regions (evaluation only)
    crowd_classes: np.ndarray   # int64 [K]
    payload: memoryview

    @property
    def size(self) -> tuple[int, int]:
        return self.height, self.width

    @property
    def orig_size(self) -> tuple[int, int]:
        return self.orig_height, self.orig_width

    @property
    def where(self) -> str:
        return f"record {self.index} ({self.file_name}) in shard {self.shard}"

    def decode(self, min_size: tuple[int, int] | None = None) -> np.ndarray:
        """Upright RGB uint8 HWC (a JPEG at a DCT-reduced scale no smaller than `min_size`); raw
        payloads as a read-only view. A payload that fails to decode raises DecodeError naming the record."""
        try:
            return _codec.decode_payload(self.codec, self.payload, self.size, min_size, self.orientation)
        except _codec.DecodeError as e:
            raise _codec.DecodeError(f"{self.where}: {e}; run `fastfeed verify --decode` and re-pack") from None

    def cover(self, side: int) -> tuple[int, int] | None:
        """The min_size that decodes just enough pixels for an output of long side `side`."""
        return _codec.cover_size(self.height, self.width, side)

    def decode_to_cover(self, side: int) -> np.ndarray:
        """Decoded at the smallest DCT scale whose long side still reaches `side` (what a loader needs)."""
        return self.decode(self.cover(side))

    def decoded_size(self, side: int | None = None) -> tuple[int, int]:
        """(h, w) of `decode_to_cover(side)` (or of `decode()`), without decoding."""
        return _codec.decoded_size(self.codec, self.size, self.cover(side) if side else None, self.orientation)

    def pixel_boxes(self, size: tuple[int, int] | None = None) -> np.ndarray:
        """Training boxes in pixels of an image of `size` (h, w; default: the record's)."""
        h, w = size or self.size
        return self.boxes * np.array([w, h, w, h], np.float32)


def parse_record(buf, index: int, shard: str, check: bool = True) -> Record:
    """Split a record's bytes (a memoryview into the map is fine: the payload stays a view of it).
    Raises RecordCorrupt naming the record when the magic, layout or (with `check`) the CRC is wrong."""
    def bad(why: str) -> RecordCorrupt:
        return RecordCorrupt(f"record {index} in shard {shard}: {why}; run `fastfeed verify` and re-pack")

    if len(buf) < HEADER.size or bytes(buf[:4]) != MAGIC:
        raise bad("bad record magic (not a fastfeed record, or damaged)")
    if check and not check_crc(buf):
        raise bad("CRC32 mismatch")
    (_, _, codec_id, _, orientation, h, w, oh, ow, image_id, nb, nc, nl) = HEADER.unpack_from(buf, 0)
    if codec_id >= len(CODECS):
        raise bad(f"unknown codec id {codec_id}")
    if orientation > 8:
        raise bad(f"orientation {orientation} is not 0..8")
    off = HEADER.size
    name = bytes(buf[off:off + nl]).decode("utf-8", "replace")
    off += nl
    n = nb + nc
    if len(buf) < off + n * 20:
        raise bad("shorter than its boxes")
    boxes = np.frombuffer(buf, "<f4", n * 4, off).reshape(n, 4).astype(np.float32)
    off += n * 16
    classes = np.frombuffer(buf, "<i4", n, off).astype(np.int64)
    off += n * 4
    payload = buf[off:]
    if codec_id == _CODEC_ID["raw"] and len(payload) != h * w * 3:
        raise bad(f"raw payload of {len(payload)} bytes, expected {h}x{w}x3")
    return Record(index, shard, CODECS[codec_id], h, w, oh, ow, orientation or 1, image_id, name,
                  boxes[:nb], classes[:nb], boxes[nb:], classes[nb:], payload)


# --- manifest -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardInfo:
    file: str     # shard_file(k)
    count: int    # records in it
    bytes: int    # file size: a reader refuses a shard of another size (truncated or replaced)
    start: int    # global index of its first record
    sha256: str | None = None   # of the file's bytes (version 3; a download is checked against it)


@dataclass
class Manifest:
    """What a store holds (manifest.json; keys documented in docs/format.md). The nested dicts are
    `payload` {store, max_side, quality}, `source` {format, root, split, annotations, images_seen,
    fingerprint}, `stats` {class_boxes, sizes, record_bytes}, `report` {errors, notes, examples}."""

    num_images: int
    num_boxes: int
    num_crowd: int
    classes: list
    category_ids: list
    payload: dict
    shards: list                 # [ShardInfo]
    fingerprint: str             # of the content: records, classes and payload settings
    source: dict
    pack_options: dict
    stats: dict
    report: dict
    created: str
    fastfeed_version: str
    format_version: int = FORMAT_VERSION

    @property
    def store_mode(self) -> str:
        """How pixels are stored: 'original' | 'jpeg' | 'raw'."""
        return self.payload["store"]

    @property
    def source_fingerprint(self) -> str:
        """Of the source the store was packed from: image and label files, annotation JSON."""
        return self.source["fingerprint"]

    def to_json(self) -> dict:
        d = {"format": FORMAT_NAME}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = [asdict(s) for s in v] if f.name == "shards" else v
        return d

    @classmethod
    def from_json(cls, d: dict, path) -> Manifest:
        try:
            kw = {f.name: d[f.name] for f in fields(cls) if f.name in d or f.default is MISSING}
            kw["shards"] = [ShardInfo(**s) for s in kw["shards"]]
            return cls(**kw)
        except (KeyError, TypeError) as e:
            raise FormatError(f"{path} lacks or mangles the manifest entry {e}; the store is damaged, "
                              "re-run `fastfeed pack`") from None


def write_manifest(path, manifest: Manifest) -> None:
    Path(path).write_bytes(manifest_bytes(manifest))


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=1) + "\n").encode("utf-8")


def read_manifest(path) -> Manifest:
    """Load and version-check a manifest (any of READABLE_VERSIONS); errors say what the file is and what to do."""
    try:
        return parse_manifest(Path(path).read_bytes(), path)
    except FileNotFoundError:
        raise FormatError(f"{path} not found: not a fastfeed store (create one with `fastfeed pack`)") from None


def parse_manifest(data: bytes, path) -> Manifest:
    """A manifest from its bytes (`path`: where it came from, for messages)."""
    try:
        m = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path} is not valid JSON ({e}); the store is damaged, re-run `fastfeed pack`") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise FormatError(f"{path} is not a fastfeed manifest")
    version = m.get("format_version")
    if version not in READABLE_VERSIONS:
        raise FormatError(f"store format version {version} but this fastfeed reads versions "
                          f"{', '.join(map(str, READABLE_VERSIONS))}: re-pack the dataset with this fastfeed, or use the "
                          "fastfeed release that wrote it")
    return Manifest.from_json(m, path)
