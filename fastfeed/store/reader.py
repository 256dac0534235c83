"""`Store`: random-access, read-only, fork- and spawn-safe reads of a packed store."""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path

import lmdb
import numpy as np

from . import changed, objstore, publish
from . import format as fmt
from .format import Record
from .handles import _HANDLES, _acquire, _release, lmdb_failed
from .not_store import not_a_store


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_mtime_ns


@dataclass(slots=True)
class Sample:
    """One image and its labels. `image` is upright RGB uint8 HWC, or None when read with decode=False."""

    index: int
    image: np.ndarray | None
    data: bytes | None          # the encoded payload (decode=False), else None
    codec: str                  # 'jpeg' | 'cv2' | 'raw'
    boxes: np.ndarray           # float32 [N,4] x1,y1,x2,y2 normalised 0..1 (training boxes)
    classes: np.ndarray         # int64 [N] contiguous 0..C-1
    crowd_boxes: np.ndarray     # float32 [K,4] iscrowd regions (evaluation only)
    crowd_classes: np.ndarray   # int64 [K]
    size: tuple[int, int]       # (h, w) of the stored image, upright
    orig_size: tuple[int, int]  # (h, w) of the source image, upright
    image_id: int
    file_name: str
    orientation: int = 1        # the EXIF orientation `image` was turned by (data is as stored)


class Store:
    """Read a fastfeed store. `len(store)`, `store[i] -> Sample`, `store.record(i) -> Record`: the
    `source.RecordSource` protocol every loader reads through.

    LMDB environments open lazily in each process (read-only, no lock file), so a `Store` pickles
    cheaply into worker processes and is safe after fork. Every read checks the record's CRC32
    unless `check_crc=False`. A Store keeps reading the pack it was opened on; if the store is
    re-packed in place before this process first reads it, reads raise FormatError (open it again).
    """

    def __new__(cls, path=None, *args, **kwargs):
        if cls is Store and objstore.is_url(path):   # a store in object storage: the same reads, its shards cached
            from .remote import RemoteStore

            return super().__new__(RemoteStore)
        return super().__new__(cls)

    def __init__(self, path, check_crc: bool = True, **remote):
        if remote:
            raise ValueError(f"{', '.join(sorted(remote))}: options of a store at a URL (s3://...); {path} is a folder")
        self.path = Path(path)
        publish.tidy(self.path)   # what an interrupted pack left: the old store put back, the rest removed
        if not (self.path / fmt.MANIFEST).is_file() and (pid := publish.pack_in_progress(self.path)) is not None:
            raise fmt.FormatError(f"{self.path} is being packed right now (fastfeed pack, pid {pid}): wait for the "
                                  "pack to finish, then open it")
        if not (self.path / fmt.MANIFEST).is_file() and (error := not_a_store(self.path)) is not None:
            raise error   # missing, a file, a data.yaml, a dataset folder: each named, with what to do
        manifest_path = self.path / fmt.MANIFEST
        self.manifest = fmt.read_manifest(manifest_path)
        self._identity = _identity(manifest_path)
        self.check_crc = check_crc
        self.shards = self.manifest.shards
        self._starts = [s.start for s in self.shards]
        self._len = int(self.manifest.num_images)
        self._pid = None
        self._handles: list = []
        self._keys: list = []
        changed.register(self)

    # --- metadata ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @property
    def class_names(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def category_ids(self) -> list[int]:
        """The source's category id of each contiguous class (COCO's sparse 1..90 ids)."""
        return list(self.manifest.category_ids)

    @property
    def fingerprint(self) -> str:
        """Of the content (records, classes, payload settings): caches are keyed by it."""
        return self.manifest.fingerprint

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, images={len(self)}, classes={len(self.class_names)})"

    # --- process-local LMDB handles ---------------------------------------------------------------
    def __getstate__(self):
        return {k: getattr(self, k) for k in ("path", "manifest", "_identity", "check_crc", "shards", "_starts",
                                              "_len")}

    def __setstate__(self, state):
        for k, v in state.items():
            setattr(self, k, v)
        self._pid, self._handles, self._keys = None, [], []
        changed.register(self)

    def _repacked(self) -> bool:
        try:
            return _identity(self.path / fmt.MANIFEST) != self._identity
        except OSError:
            return True

    def _open(self) -> None:
        if self._repacked():
            raise fmt.FormatError(f"the store at {self.path} was re-packed or removed after this Store was opened; "
                                  "open it again (Store(path)) to read the new pack")
        found = []
        for s in self.shards:
            file = self.path / s.file
            try:
                st = os.stat(file)
            except FileNotFoundError:
                raise fmt.FormatError(f"shard {s.file} is missing from {self.path}; restore it or re-pack") from None
            if st.st_size != s.bytes:  # reading a truncated map would kill us with SIGBUS
                raise fmt.FormatError(f"shard {s.file} of {self.path} is {st.st_size} bytes, the manifest "
                                      f"says {s.bytes}: truncated or replaced; re-pack or restore it")
            found.append(((st.st_dev, st.st_ino), str(file)))
        self._handles, self._keys = [], []
        try:
            for (key, file), s in zip(found, self.shards):
                try:
                    self._handles.append(_acquire(key, file))
                except lmdb.Error as e:
                    raise fmt.FormatError(f"shard {s.file} of {self.path} cannot be opened ({e}); "
                                          "the store is damaged: re-pack it or restore the shard") from None
                self._keys.append(key)
            if self._repacked():   # swapped while we opened: these maps may mix two packs
                raise fmt.FormatError(f"the store at {self.path} was re-packed while this Store was opening it; "
                                      "open it again")
        except BaseException:
            for key in self._keys:
                _release(key)
            self._handles, self._keys = [], []
            raise
        self._pid = os.getpid()

    def close(self) -> None:
        if self._pid == os.getpid():
            for key in self._keys:
                _release(key)
        self._pid, self._handles, self._keys = None, [], []

    def shard_url(self, shard: int) -> str:
        """Where shard number `shard` is (a file path here; a URL for a store in object storage)."""
        return str(self.path / self.shards[shard].file)

    def fetch(self, shard: int, wait: bool = True) -> bool:
        """Make shard `shard` readable here: a local shard is (a remote store downloads it into its cache)."""
        return True

    def shard_entries(self, shard: int) -> int:
        """Records LMDB holds in shard number `shard` (verify compares it with the manifest)."""
        if self._pid != os.getpid():
            self._open()
        try:
            return _HANDLES[self._keys[shard]].env.stat()["entries"]
        except lmdb.Error as e:
            raise lmdb_failed(e, str(self.path / self.shards[shard].file)) from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _locate(self, index: int) -> int:
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range: the store holds {self._len} records")
        return bisect.bisect_right(self._starts, index) - 1

    def shard_of(self, index: int) -> int:
        """The number (index into `shards`) of the shard holding record `index`."""
        return self._locate(int(index))

    def shard_name(self, index: int) -> str:
        """File name of the shard holding record `index`."""
        return self.shards[self._locate(index)].file

    def reopen(self) -> Store:
        """A new Store over the same folder as it is now (after a re-pack: the new pack), same settings."""
        return Store(self.path, check_crc=self.check_crc)

    # --- reads ------------------------------------------------------------------------------------
    def record(self, index: int, check_crc: bool | None = None) -> Record:
        """Record `index`, parsed, CRC-checked (unless `check_crc` is False, default: the Store's), not
        decoded: the one way every reader gets a record. Its payload is a view valid while the Store is open.
        A damaged record raises RecordCorrupt naming it and its shard."""
        if self._pid != os.getpid():
            self._open()
        index = int(index)
        shard = self._locate(index)
        info, h = self.shards[shard], self._handles[shard]
        name = info.file
        if (size := os.fstat(h.fd).st_size) != info.bytes:   # reading a shrunk map would kill us (SIGBUS)
            raise fmt.StoreChanged(f"record {index}: " + changed.under_reader(
                [f"shard {self.path / name} is now {size} bytes, {info.bytes} when packed"]))
        try:
            buf = h.txn.get(fmt.record_key(index - self._starts[shard]))
        except lmdb.Error as e:
            raise fmt.RecordCorrupt(f"{lmdb_failed(e, str(self.path / name), index)}; run `fastfeed verify` and "
                                    "re-pack") from None
        if buf is None:
            raise fmt.RecordCorrupt(f"record {index} missing from shard {name}; run `fastfeed verify` and re-pack")
        return fmt._parse_record(buf, index, name, self.check_crc if check_crc is None else check_crc)

    def __getitem__(self, index: int) -> Sample:
        return self.get(int(index))

    def get(self, index: int, decode: bool = True, min_size: tuple[int, int] | None = None) -> Sample:
        """Read record `index` as a Sample.

        decode=False returns the encoded payload in `data` (raw stores: the pixel bytes).
        min_size=(h, w) lets a JPEG decode at a DCT-reduced scale no smaller than that.
        """
        r = self.record(index)
        image = data = None
        if decode:
            image = r.decode(min_size)
            if not image.flags.writeable:   # raw payloads are views into the map
                image = image.copy()
        else:
            data = bytes(r.payload)
        return Sample(r.index, image, data, r.codec, r.boxes, r.classes, r.crowd_boxes, r.crowd_classes, r.size,
                      r.orig_size, r.image_id, r.file_name, r.orientation)
