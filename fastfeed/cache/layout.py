"""The layout of a shm cache slab: the one place that knows it, and its version (docs/format.md, "The shared
decoded-image cache", describes the same for people). No pickle: a fixed little-endian header of one page, then
numpy tables at the byte offsets it gives, each on a 64-byte boundary; the state field is written last. And a
slab's files, read without attaching (what attaching, `lease.py`, and listing or clearing, `manage.py`, both
read): its users lock (`users_path`), its builders' temporary files (`temp_files`), whether it is usable (`probe`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..procs import alive

CACHE_VERSION = 1
MAGIC = b"FFCACHE\x00"
STATE_BUILDING, STATE_COMPLETE = 0, 1
FLAG_PARTIAL = 1
SUFFIX = ".cache"
PREFIX = "fastfeed-"

# magic, version, state, builder_pid, imgsz, flags, n_records, n_cached, n_boxes, total_bytes,
# shapes, offsets, box_idx, boxes, classes, pixels (byte offsets), created (unix time), fingerprint
HEADER = struct.Struct("<8sIIqIIqqqq6qd64s")
STATE_OFFSET = 12
HEADER_BYTES = 4096
_ALIGN = 64


class CacheFormatError(ValueError):
    """Bytes that are not a complete cache slab of this version."""


def slab_name(fingerprint: str, imgsz: int) -> str:
    """The slab of a store (by content fingerprint) at one imgsz, for this format version."""
    return f"{PREFIX}{fingerprint}-{imgsz}-v{CACHE_VERSION}{SUFFIX}"


def slab_path(cache_dir, fingerprint: str, imgsz: int) -> Path:
    return Path(cache_dir) / slab_name(fingerprint, imgsz)


def _align(n, a: int = _ALIGN):
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class Header:
    version: int
    state: int
    builder_pid: int
    imgsz: int
    flags: int
    n_records: int
    n_cached: int
    n_boxes: int
    total_bytes: int
    shapes_off: int
    offsets_off: int
    box_idx_off: int
    boxes_off: int
    classes_off: int
    pixels_off: int
    created: float
    fingerprint: str

    @property
    def partial(self) -> bool:
        return self.n_cached < self.n_records

    def pack(self) -> bytes:
        values = [getattr(self, f.name) for f in fields(self)]
        values[-1] = values[-1].encode("ascii")
        return HEADER.pack(MAGIC, *values).ljust(HEADER_BYTES, b"\0")


def read_header(buf) -> Header:
    """Parse the header; raises CacheFormatError naming what is wrong (and both versions)."""
    if len(buf) < HEADER.size:
        raise CacheFormatError(f"{len(buf)} bytes: shorter than a cache header")
    magic, *values = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CacheFormatError("not a fastfeed cache slab (bad magic)")
    if values[0] != CACHE_VERSION:
        raise CacheFormatError(f"cache format version {values[0]}, this fastfeed reads version {CACHE_VERSION}")
    values[-1] = values[-1].rstrip(b"\0").decode("ascii", "replace")
    return Header(*values)


def slab_bytes(shapes: np.ndarray, box_counts: np.ndarray) -> np.ndarray:
    """Bytes of a slab caching the first k records, for every k in 0..len(shapes)."""
    k = np.arange(len(shapes) + 1, dtype=np.int64)
    b = np.concatenate([[0], np.cumsum(box_counts, dtype=np.int64)])
    tables = (_align(k * 8) + _align(k * 8) + _align((k + 1) * 8) + _align(b * 16) + _align(b * 8))
    pixels = np.concatenate([[0], np.cumsum(_align(shapes[:, 0].astype(np.int64) * shapes[:, 1] * 3))])
    return _align(HEADER_BYTES + tables, 4096) + pixels


@dataclass(frozen=True)
class Layout:
    header: Header
    offsets: np.ndarray    # uint64 [K]
    box_idx: np.ndarray    # uint64 [K + 1]


def plan(shapes: np.ndarray, box_counts: np.ndarray, *, n_records: int, imgsz: int, fingerprint: str,
         builder_pid: int, created: float) -> Layout:
    """Where everything goes for caching records 0..len(shapes)-1 (`shapes` uint32 [K, 2])."""
    k = len(shapes)
    box_idx = np.concatenate([[0], np.cumsum(box_counts, dtype=np.int64)]).astype(np.uint64)
    n_boxes = int(box_idx[-1])
    tables = [_align(n) for n in (k * 8, k * 8, (k + 1) * 8, n_boxes * 16, n_boxes * 8)]   # as slab_bytes counts
    places = [HEADER_BYTES + sum(tables[:i]) for i in range(len(tables))]
    pixels_off = _align(HEADER_BYTES + sum(tables), 4096)
    sizes = _align(shapes[:, 0].astype(np.int64) * shapes[:, 1] * 3)
    offsets = (pixels_off + np.concatenate([[0], np.cumsum(sizes)[:-1]]) if k else np.zeros(0)).astype(np.uint64)
    total = pixels_off + int(sizes.sum())
    header = Header(CACHE_VERSION, STATE_BUILDING, builder_pid, imgsz, FLAG_PARTIAL if k < n_records else 0,
                    n_records, k, n_boxes, total, *places, pixels_off, created, fingerprint)
    return Layout(header, offsets, box_idx)


class View:
    """Zero-copy numpy views of a mapped slab; `record(i)` is what a loader reads."""

    def __init__(self, buf):
        self.header = h = read_header(buf)
        if h.state != STATE_COMPLETE:
            raise CacheFormatError("half-written: the builder has not marked it complete")
        if len(buf) != h.total_bytes:
            raise CacheFormatError(f"{len(buf)} bytes, the header says {h.total_bytes}")
        k, b = h.n_cached, h.n_boxes
        self.mem = np.frombuffer(buf, np.uint8)
        self.shapes = np.frombuffer(buf, np.uint32, k * 2, h.shapes_off).reshape(k, 2)
        self.offsets = np.frombuffer(buf, np.uint64, k, h.offsets_off)
        self.box_idx = np.frombuffer(buf, np.uint64, k + 1, h.box_idx_off)
        self.boxes = np.frombuffer(buf, np.float32, b * 4, h.boxes_off).reshape(b, 4)
        self.classes = np.frombuffer(buf, np.int64, b, h.classes_off)

    def record(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(image HWC RGB uint8, boxes normalised xyxy float32, classes int64): views, no copy."""
        h, w = self.shapes[i]
        o = int(self.offsets[i])
        b0, b1 = int(self.box_idx[i]), int(self.box_idx[i + 1])
        return self.mem[o:o + int(h) * int(w) * 3].reshape(h, w, 3), self.boxes[b0:b1], self.classes[b0:b1]


def users_path(slab: Path) -> Path:
    return slab.with_name(slab.name + ".users")


def temp_path(slab: Path, pid: int) -> Path:
    return slab.with_name(f"{slab.name}.tmp-{pid}")


def temp_files(slab: Path) -> list[tuple[Path, int]]:
    """(path, builder pid) of every temporary build file of `slab` (`temp_path`'s names; -1: no pid in it)."""
    named = ((p, p.name.rsplit("-", 1)[-1]) for p in slab.parent.glob(slab.name + ".tmp-*"))
    return [(p, int(pid) if pid.isdigit() else -1) for p, pid in named]


def probe(slab: Path, fingerprint: str | None = None, imgsz: int | None = None) -> tuple[Header | None, str]:
    """(header, "") of a usable slab; (None, why not) otherwise; (None, "") when there is none."""
    try:
        with open(slab, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER.size)
    except FileNotFoundError:
        return None, ""
    try:
        h = read_header(head)
    except CacheFormatError as e:
        return None, str(e)
    if h.state != STATE_COMPLETE:
        who = "alive" if alive(h.builder_pid) else "dead"
        return None, f"half-written (state {h.state}, builder pid {h.builder_pid}, {who})"
    if size != h.total_bytes:
        return None, f"{size} bytes, the header says {h.total_bytes}: truncated or overwritten"
    if fingerprint is not None and h.fingerprint != fingerprint:
        return None, f"holds store {h.fingerprint}, not {fingerprint}"
    if imgsz is not None and h.imgsz != imgsz:
        return None, f"built for imgsz {h.imgsz}, not {imgsz}"
    return h, ""
