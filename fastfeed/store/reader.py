"""`Store`: random-access, read-only, fork- and spawn-safe reads of a packed store."""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path

import lmdb
import numpy as np

from .. import codec
from . import format as fmt


@dataclass(slots=True)
class _Handle:
    pid: int
    env: lmdb.Environment
    txn: lmdb.Transaction
    users: int = 0


# py-lmdb refuses to open one file twice in a process, and a forked child inherits the parent's
# open environments; so handles live here, per file, shared by every Store of this process.
_HANDLES: dict[str, _Handle] = {}


def _acquire(file: str) -> lmdb.Transaction:
    h = _HANDLES.get(file)
    if h is not None and h.pid != os.getpid():
        # Inherited through fork: LMDB handles must not cross processes. Dropping them here only
        # unmaps this child's copy (read-only, lock=False: no reader slots or lock files to disturb).
        try:
            h.txn.abort()
            h.env.close()
        except lmdb.Error:
            pass
        h = None
    if h is None:
        env = lmdb.open(file, subdir=False, readonly=True, lock=False, readahead=False,
                        max_readers=2048, meminit=False)
        # One long read transaction per process: the store is immutable, and buffers stay valid.
        h = _HANDLES[file] = _Handle(os.getpid(), env, env.begin(buffers=True))
    h.users += 1
    return h.txn


def _release(file: str) -> None:
    h = _HANDLES.get(file)
    if h is None or h.pid != os.getpid():
        return
    h.users -= 1
    if h.users <= 0:
        h.txn.abort()
        h.env.close()
        del _HANDLES[file]


@dataclass(slots=True)
class Sample:
    """One image and its labels. `image` is RGB uint8 HWC, or None when read with decode=False."""

    index: int
    image: np.ndarray | None
    data: bytes | None          # the encoded payload (decode=False), else None
    codec: str                  # 'jpeg' | 'cv2' | 'raw'
    boxes: np.ndarray           # float32 [N,4] x1,y1,x2,y2 normalised 0..1 (training boxes)
    classes: np.ndarray         # int64 [N] contiguous 0..C-1
    crowd_boxes: np.ndarray     # float32 [K,4] iscrowd regions (evaluation only)
    crowd_classes: np.ndarray   # int64 [K]
    size: tuple[int, int]       # (h, w) of the stored payload
    orig_size: tuple[int, int]  # (h, w) of the source image
    image_id: int
    file_name: str


class Store:
    """Read a fastfeed store. `len(store)`, `store[i] -> Sample`.

    LMDB environments open lazily in each process (read-only, no lock file), so a `Store` pickles
    cheaply into worker processes and is safe after fork. Every read checks the record's CRC32
    unless `check_crc=False`.
    """

    def __init__(self, path, check_crc: bool = True):
        self.path = Path(path)
        if not self.path.is_dir():
            raise fmt.FormatError(f"{self.path} is not a directory: not a fastfeed store "
                                  "(create one with `fastfeed pack SRC -o OUT`)")
        self.manifest = fmt.read_manifest(self.path / fmt.MANIFEST)
        self.check_crc = check_crc
        self.shards = self.manifest["shards"]
        self._starts = [s["start"] for s in self.shards]
        self._len = int(self.manifest["num_images"])
        self._pid = None
        self._txns: list = []
        self._envs: list = []

    # --- metadata ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @property
    def class_names(self) -> list[str]:
        return list(self.manifest["classes"])

    @property
    def category_ids(self) -> list[int]:
        """The source's category id of each contiguous class (COCO's sparse 1..90 ids)."""
        return list(self.manifest["category_ids"])

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, images={len(self)}, classes={len(self.class_names)})"

    # --- process-local LMDB handles ---------------------------------------------------------------
    def __getstate__(self):
        state = {k: getattr(self, k) for k in ("path", "manifest", "check_crc", "shards", "_starts", "_len")}
        return state

    def __setstate__(self, state):
        for k, v in state.items():
            setattr(self, k, v)
        self._pid, self._txns, self._envs = None, [], []

    def _open(self) -> None:
        files = []
        for s in self.shards:
            file = self.path / s["file"]
            if not file.is_file():
                raise fmt.FormatError(f"shard {s['file']} is missing from {self.path}")
            if file.stat().st_size != s["bytes"]:  # reading a truncated map would kill us with SIGBUS
                raise fmt.FormatError(f"shard {s['file']} of {self.path} is {file.stat().st_size} bytes, the manifest "
                                      f"says {s['bytes']}: truncated or replaced; re-pack or restore it")
            files.append(os.path.realpath(file))
        self._txns = []
        for f, s in zip(files, self.shards):
            try:
                self._txns.append(_acquire(f))
            except lmdb.Error as e:
                for g in files[:len(self._txns)]:
                    _release(g)
                self._txns = []
                raise fmt.FormatError(f"shard {s['file']} of {self.path} cannot be opened ({e}); "
                                      "the store is damaged: re-pack it or restore the shard") from None
        self._envs, self._pid = files, os.getpid()  # _envs: the files whose handles this Store holds

    def close(self) -> None:
        if self._pid == os.getpid():
            for f in self._envs:
                _release(f)
        self._pid, self._txns, self._envs = None, [], []

    def shard_entries(self, shard: int) -> int:
        """Records LMDB holds in shard number `shard` (verify compares it with the manifest)."""
        if self._pid != os.getpid():
            self._open()
        return _HANDLES[self._envs[shard]].env.stat()["entries"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _locate(self, index: int) -> int:
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range: the store holds {self._len} records")
        return bisect.bisect_right(self._starts, index) - 1

    def shard_name(self, index: int) -> str:
        """File name of the shard holding record `index`."""
        return self.shards[self._locate(index)]["file"]

    def raw_record(self, index: int) -> memoryview:
        """The record bytes, a view into the map valid while this Store is open."""
        if self._pid != os.getpid():
            self._open()
        shard = self._locate(index)
        buf = self._txns[shard].get(fmt.record_key(index - self._starts[shard]))
        if buf is None:
            raise fmt.RecordCorrupt(f"record {index} missing from shard {self.shards[shard]['file']}")
        return buf

    # --- reads ------------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Sample:
        return self.get(int(index))

    def get(self, index: int, decode: bool = True, min_size: tuple[int, int] | None = None) -> Sample:
        """Read record `index`.

        decode=False returns the encoded payload in `data` (raw stores: the pixel bytes).
        min_size=(h, w) lets a JPEG decode at a DCT-reduced scale no smaller than that.
        """
        buf = self.raw_record(index)
        try:
            head, name, boxes, classes, payload = fmt.decode_record(buf, self.check_crc)
        except fmt.RecordCorrupt as e:
            raise fmt.RecordCorrupt(f"record {index} in shard {self.shard_name(index)}: {e}; "
                                    "run `fastfeed verify` and re-pack") from None
        image = data = None
        if not decode:
            data = bytes(payload)
        elif head.codec == "raw":
            image = np.frombuffer(payload, np.uint8).reshape(head.height, head.width, 3).copy()
        elif head.codec == "jpeg":
            image = codec.decode_jpeg(payload, min_size)
        else:
            image = codec.decode_cv2(payload)
        nb = head.n_boxes
        return Sample(index, image, data, head.codec, boxes[:nb], classes[:nb], boxes[nb:], classes[nb:],
                      (head.height, head.width), (head.orig_height, head.orig_width), head.image_id, name)
