"""`Store`: random-access, read-only, fork- and spawn-safe reads of a packed store, through its shard provider:
a local folder's (`local.LocalShards`) or, for a URL, the node's shard cache (`remote.shards.RemoteShards`)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from ..renamed import renamed
from . import urls
from .options import StoreOptions
from .record import Record
from .source import PASSED, ShardProvider

POLL_S = 0.002   # how often `arrival` looks again while every shard it needs is downloading


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


@renamed(prefetch_depth="read_ahead", keywords=False)   # the keyword: StoreOptions.of
class Store(AbstractContextManager):
    """Read a fastfeed store. `len(store)`, `store[i] -> Sample`, `store.record(i) -> Record`: the
    `source.RecordSource` protocol every loader reads through.

    `path`: a folder, or a URL (s3://, gs://, any fsspec URL) whose shards are downloaded into the node's shard
    cache as reads need them. `options` (`StoreOptions`, or its fields as keywords: shard_cache, shard_cache_limit,
    read_ahead, storage_options, retries; `prefetch_depth` is read_ahead's old name): how a store at a URL is read;
    each one not given takes its built-in default (see `options.py`). A folder takes no keyword options.

    LMDB environments open lazily in each process (read-only, no lock file), so a `Store` pickles
    cheaply into worker processes (with its options) and is safe after fork. Every read checks the record's CRC32
    unless `check_crc=False`. A Store keeps reading the pack it was opened on; if the store is
    re-packed in place before this process first reads it, reads raise FormatError (open it again).
    """

    provider: ShardProvider   # what it reads through; the members `source.PASSED` names are the Store's too

    def __init__(self, path, check_crc: bool = True, options: StoreOptions | None = None, **given):
        remote = urls.is_url(path)
        if given and not remote:
            raise ValueError(f"{', '.join(sorted(given))}: options of a store at a URL (s3://...); {path} is a folder")
        self.options = StoreOptions.of(options, **given)
        if remote:
            from .remote.shards import RemoteShards  # fsspec and the shard cache only for a URL

            self.provider = RemoteShards(path, self.options)
        else:
            from .local import LocalShards

            self.provider = LocalShards(path)
        self.check_crc = check_crc
        self._index()

    def _index(self) -> None:
        self.path = self.provider.path
        self.manifest = self.provider.manifest
        self.shards = self.manifest.shards
        self._starts = [s.start for s in self.shards]
        self._len = int(self.manifest.num_images)

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
        cache = f", cache={str(self.cache.root)!r}" if self.cache is not None else ""
        return f"Store({str(self.path)!r}, images={len(self)}, classes={len(self.class_names)}{cache})"

    # --- what its shard provider says (`source.ShardFacts`: the members `PASSED` names) ---------------------
    def __getattr__(self, name: str):
        if name in PASSED and "provider" in self.__dict__:
            return getattr(self.__dict__["provider"], name)
        raise AttributeError(f"'Store' object has no attribute {name!r}")

    def __getstate__(self):
        return {"provider": self.provider, "options": self.options, "check_crc": self.check_crc}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._index()

    def close(self) -> None:
        """Release this process's handles (maps, lock files); reads reopen them."""
        self.provider.close()

    def __exit__(self, *exc):
        self.close()

    def shard_of(self, index: int) -> int:
        """The number (index into `shards`) of the shard holding record `index`."""
        index = int(index)
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range: the store holds {self._len} records")
        return bisect.bisect_right(self._starts, index) - 1

    def arrival(self, indices) -> Iterator[int]:
        """Positions into `indices` in an order that never waits for one shard's download while another record is
        readable: first those readable now (local, in the node's cache, or with no download under way: the read
        downloads it), then each as its download ends (looked at every POLL_S). A batch from a bucket is then
        decoded as its shards arrive, not after the slowest (docs/design.md, "A store in object storage")."""
        shards = [self.shard_of(i) for i in indices]
        pending = list(range(len(shards)))
        while pending:
            ready = {k: not self.provider.waiting(k) for k in dict.fromkeys(shards[p] for p in pending)}
            if not any(ready.values()):
                time.sleep(POLL_S)
                continue
            yield from (p for p in pending if ready[shards[p]])
            pending = [p for p in pending if not ready[shards[p]]]

    def shard_name(self, index: int) -> str:
        """File name of the shard holding record `index`."""
        return self.shards[self.shard_of(index)].file

    def reopen(self) -> Store:
        """A new Store over the same place as it is now (after a re-pack: the new pack), same settings."""
        return Store(self.provider.location, check_crc=self.check_crc, options=self.options)

    def record(self, index: int, check_crc: bool | None = None) -> Record:
        """Record `index`, parsed, CRC-checked (unless `check_crc` is False, default: the Store's), not
        decoded: the one way every reader gets a record. A local record's payload is a view valid while the Store
        is open; one from a URL owns its bytes. A damaged record raises RecordCorrupt naming it and its shard."""
        index = int(index)
        return self.provider.record(index, self.shard_of(index), self.check_crc if check_crc is None else check_crc)

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
