"""A record's bytes: the layout a pack writes (`encode_record`) and a reader parses (`parse_record` -> `Record`);
the layout, field by field (little-endian, CRC32 over every byte after the CRC field; boxes normalised to 0..1 of
the upright image, training boxes then `iscrowd` ones; the task's geometry in FFR2): docs/format.md, 'Record
layout'. The byte layout is private to `fastfeed/store/`: everything else reads `Store.record(i) -> Record` and
decodes with `Record.decode` (docs/design.md, 'Data flow').
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .. import codec as _codec
from .. import tasks as _tasks
from ..renamed import renamed
from .format import FormatError, RecordCorrupt

try:  # the same CRC-32 as zlib's, computed with carry-less multiplication: ~7x faster
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; stay readable without it
    from zlib import crc32

MAGIC = b"FFR2"      # format version 4: HEADER2 and the geometry section
MAGIC_V1 = b"FFR1"   # format versions 1-3: HEADER, no geometry (still read)
CODECS = ("jpeg", "cv2", "raw")  # cv2: any other encoded format, decoded by OpenCV
_CODEC_ID = {name: i for i, name in enumerate(CODECS)}

# magic, crc32, codec, channels, orientation, height, width, orig_h, orig_w, image_id, n_boxes, n_crowd, name_len
HEADER = struct.Struct("<4sIBBHIIIIqIIH")
# ... then task id (its index in fastfeed.tasks.REGISTRY), keypoints per object K, values per keypoint D (2 or 3; pose only)
HEADER2 = struct.Struct("<4sIBBHIIIIqIIHBHB")
_CRC_FROM = 8  # the CRC covers everything after magic and the CRC itself


def encode_record(*, codec: str, height: int, width: int, orig_height: int, orig_width: int,
                  image_id: int, file_name: str, boxes: np.ndarray, classes: np.ndarray,
                  crowd_boxes: np.ndarray, crowd_classes: np.ndarray, payload: bytes, orientation: int = 1,
                  task: str = "detect", geometry=None) -> bytes:
    """One record's bytes. height/width/boxes: of the upright image; orientation: what turns the decoded
    payload upright (1 for pixels stored upright). `geometry`: `task`'s, one entry per training box, normalised
    (segment: [P,2] arrays, P may be 0; pose: [N,K,D]; obb: [N,4,2]); its bytes are the task's (`fastfeed.tasks`)."""
    name = file_name.encode("utf-8")
    if len(name) > 0xFFFF:
        raise FormatError(f"file name longer than 65535 bytes: {file_name[:80]}...")
    if not 1 <= orientation <= 8:
        raise FormatError(f"orientation must be 1..8, got {orientation}")
    all_boxes = np.concatenate([boxes, crowd_boxes]).astype("<f4", copy=False).reshape(-1, 4)
    all_classes = np.concatenate([classes, crowd_classes]).astype("<i4", copy=False)
    try:
        spec = _tasks.get(task)
        k, d, section = spec.encode(len(boxes), geometry)
    except ValueError as e:
        raise FormatError(f"{file_name}: {e}") from None
    head = HEADER2.pack(MAGIC, 0, _CODEC_ID[codec], 3, orientation, height, width, orig_height, orig_width,
                        image_id, len(boxes), len(crowd_boxes), len(name), _tasks.REGISTRY.index(spec), k, d)
    body = b"".join([head[_CRC_FROM:], name, all_boxes.tobytes(), all_classes.tobytes(), section])
    return b"".join([MAGIC, struct.pack("<I", crc32(payload, crc32(body))), body, payload])


def record_crc(record: bytes) -> bytes:
    """The 4 CRC bytes of an encoded record (they cover all of its content: the store fingerprint uses them)."""
    return bytes(record[4:8])


def check_crc(buf) -> bool:
    return len(buf) >= HEADER.size and crc32(memoryview(buf)[_CRC_FROM:]) == struct.unpack_from("<I", buf, 4)[0]


@renamed(obb="corners", keywords=False)
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
    task: str = "detect"        # what the geometry below is: 'detect' (none), 'segment', 'pose', 'obb'
    polygons: list | None = None         # segment: float32 [P,2] x, y normalised per training box (P may be 0)
    keypoints: np.ndarray | None = None  # pose: float32 [N,K,D] x, y (, visibility) normalised
    corners: np.ndarray | None = None    # obb: float32 [N,4,2] corners normalised (was `obb`)

    @property
    def geometry(self):
        """The task's geometry (the field `fastfeed.tasks.get(self.task).field` names; None for detect)."""
        field = _tasks.get(self.task).field
        return getattr(self, field) if field else None

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

    def tile_size(self, side: int) -> tuple[int, int]:
        """(h, w) of `decode_tile(side)`: the long side `side`, never enlarged (`codec.fit_size`); the one size every
        loader takes a training image at (docs/design.md, 'DCT-scaled JPEG decode')."""
        return _codec.fit_size(self.height, self.width, side)

    def decode_tile(self, side: int) -> np.ndarray:
        """Decoded at the smallest DCT scale that covers `tile_size(side)`, then area-resized to it."""
        size = self.tile_size(side)
        return _codec.resize_to(self.decode(size), size)

    def pixel_boxes(self, size: tuple[int, int] | None = None) -> np.ndarray:
        """Training boxes in pixels of an image of `size` (h, w; default: the record's)."""
        h, w = size or self.size
        return self.boxes * np.array([w, h, w, h], np.float32)


def parse_record(buf, index: int, shard: str, check: bool = True) -> Record:
    """Split a record's bytes (a memoryview into the map is fine: the payload stays a view of it).
    Raises RecordCorrupt naming the record when the magic, layout or (with `check`) the CRC is wrong."""
    def bad(why: str) -> RecordCorrupt:
        return RecordCorrupt(f"record {index} in shard {shard}: {why}; run `fastfeed verify` and re-pack")

    magic = bytes(buf[:4])
    if len(buf) < HEADER.size or magic not in (MAGIC, MAGIC_V1):
        raise bad("bad record magic (not a fastfeed record, or damaged)")
    if magic == MAGIC and len(buf) < HEADER2.size:
        raise bad("shorter than its header")
    if check and not check_crc(buf):
        raise bad("CRC32 mismatch")
    if magic == MAGIC:
        (_, _, codec_id, _, orientation, h, w, oh, ow, image_id, nb, nc, nl, task_id, k, d) = HEADER2.unpack_from(buf, 0)
        off = HEADER2.size
    else:   # format versions 1-3: no geometry
        (_, _, codec_id, _, orientation, h, w, oh, ow, image_id, nb, nc, nl) = HEADER.unpack_from(buf, 0)
        task_id = k = d = 0
        off = HEADER.size
    if codec_id >= len(CODECS):
        raise bad(f"unknown codec id {codec_id}")
    if orientation > 8:
        raise bad(f"orientation {orientation} is not 0..8")
    name = bytes(buf[off:off + nl]).decode("utf-8", "replace")
    off += nl
    n = nb + nc
    if len(buf) < off + n * 20:
        raise bad("shorter than its boxes")
    boxes = np.frombuffer(buf, "<f4", n * 4, off).reshape(n, 4).astype(np.float32)
    off += n * 16
    classes = np.frombuffer(buf, "<i4", n, off).astype(np.int64)
    off += n * 4
    spec = _tasks.by_id(task_id)
    if spec is None:
        raise bad(f"unknown task id {task_id}")
    geometry, off = spec.parse(buf, off, k, d, nb, bad)
    payload = buf[off:]
    if codec_id == _CODEC_ID["raw"] and len(payload) != h * w * 3:
        raise bad(f"raw payload of {len(payload)} bytes, expected {h}x{w}x3")
    return Record(index, shard, CODECS[codec_id], h, w, oh, ow, orientation or 1, image_id, name,
                  boxes[:nb], classes[:nb], boxes[nb:], classes[nb:], payload, spec.name,
                  **({spec.field: geometry} if spec.field else {}))
