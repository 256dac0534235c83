"""`RemoteShards`: the shard provider `Store` reads a URL through (`Store("s3://bucket/coco.ff")`): each shard
downloaded into the node's shard cache when first needed, then opened with LMDB as a local shard is; it chooses no
order (docs/design.md, "A store in object storage reads through a node-local shard cache").
"""

from __future__ import annotations

import contextlib
import math
import os
import weakref
from collections import OrderedDict

from .. import changed, handles, objstore, urls
from .. import format as fmt
from ..options import StoreOptions
from ..record import Record
from . import damaged
from .errors import ShardDamaged
from .link import Link, warming
from .room import default_limit
from .shard_cache import ShardCache
from .sizes import default_dir, parse_size

DEFAULT_READ_AHEAD = 2        # shards downloaded ahead of the ones being read, at least
READ_AHEAD_BYTES = 16 << 20    # ... and by default at least this much (small shards: more of them ahead)
READ_AHEAD_SHARE = 0.25        # ... within this share of the shards the cache holds (the rest: the window)
_KEEP_RECENT = 2         # shards a process keeps mapped besides the pinned ones
_STORES: weakref.WeakSet = weakref.WeakSet()


def _forget_inherited() -> None:
    for s in list(_STORES):
        s._forget()


os.register_at_fork(after_in_child=_forget_inherited)


class RemoteShards:
    """A store at a URL (any fsspec protocol), its shards in the node's cache, read as `options` (`StoreOptions`: each
    field, and its default, in `options.py`; the read-ahead's: `default_read_ahead`) say."""

    remote = True

    def __init__(self, path, options: StoreOptions):
        self.url = urls.location(str(path))
        self.path = urls.shown(self.url)
        self.storage_options = dict(options.storage_options)
        self.tries = options.retries or objstore.RETRIES
        self.link = Link()
        fs, root = self._filesystem()
        where = urls.join(self.path, fmt.MANIFEST)
        manifest = urls.join(root, fmt.MANIFEST)
        try:   # a sample of the link's delay; beside it, the connections the first batch's downloads will use open
            with warming(fs, self.url, manifest), self.link.timed():
                data = objstore.read_bytes(fs, manifest, where, "reading the manifest", tries=self.tries)
        except objstore.RemoteMissing:
            raise fmt.FormatError(f"{self.path} is not a fastfeed store: it has no {fmt.MANIFEST} (it is being "
                                  f"packed, or was never packed: `fastfeed pack SRC -o {self.path}`)") from None
        self.manifest = fmt.parse_manifest(data, where)
        self.shards = self.manifest.shards
        root_dir = default_dir() if options.shard_cache is None else options.shard_cache
        limit = options.shard_cache_limit
        limit = default_limit(root_dir) if limit is None else parse_size(limit, root_dir)
        self.cache = ShardCache(root_dir, limit, self.url)
        self.cache.prepare()
        self.read_ahead_given = options.read_ahead is not None
        self.read_ahead = options.read_ahead if self.read_ahead_given else self.default_read_ahead()
        self._reset()

    @property
    def location(self) -> str:
        return self.url

    @property
    def cache_limit(self) -> int:
        return self.cache.limit

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._fs = None
        self.maps: OrderedDict = OrderedDict()   # shard number -> (lock fd, handle key, handle)
        self._read_aheads: list = []
        _STORES.add(self)
        changed.register(self)   # a cached shard truncated under a read is named (SIGBUS)

    def _forget(self) -> None:
        """In a forked child: the parent's maps and locks are not ours (closing our copy of a lock's fd leaves
        the parent's lock alone); nothing is released, everything reopens on use."""
        for fd, _, _ in self.maps.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.link = Link()   # the parent's read-ahead may hold its lock across the fork (and measures its own link)
        self._reset()

    def _filesystem(self):
        if getattr(self, "_fs", None) is None:
            self._fs = objstore.filesystem(self.url, self.storage_options)
        return self._fs

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("url", "path", "storage_options", "manifest", "shards", "cache",
                                              "read_ahead", "read_ahead_given", "link")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    # --- shards -------------------------------------------------------------------------------------------
    def shard_url(self, shard: int) -> str:
        return urls.join(self.path, self.shards[shard].file)

    def _getter(self, shard: int):
        info = self.shards[shard]
        where = self.shard_url(shard)

        def get(fd: int) -> None:   # the file system made only to download (a worker waiting for a shard the
            fs, root = self._filesystem()   # read-ahead downloads never builds one)
            try:
                with self.link.timed(info.bytes):
                    objstore.download(fs, urls.join(root, info.file), where, fd, info.bytes,
                                      part=self.link.part_bytes(objstore.PART_BYTES), tries=self.tries)
            except objstore.RemoteShort as e:
                raise ShardDamaged(f"the bucket's copy of shard {where} is damaged: {e.have} bytes, the manifest says "
                                   f"{info.bytes}. Restore the object, or re-pack the store (fastfeed pack SRC -o URL --force)") from None
            except objstore.RemoteMissing:
                if self._same_pack(fs, root):   # nothing re-packed it: the object alone was removed
                    raise objstore.RemoteError(f"shard {where} is missing from the bucket, though its store was not "
                                               "re-packed: restore the object, or re-pack the store (fastfeed pack "
                                               "SRC -o URL --force)") from None
                raise fmt.StoreChanged(f"shard {where} is gone: the store at {self.path} was re-packed (or its shards "
                                       "removed) after this Store read its manifest; open it again (Store(url)) to "
                                       "read the new pack") from None
        return get

    def _same_pack(self, fs, root) -> bool:
        """Whether the bucket's manifest is still the one this Store read (False when it cannot be read)."""
        try:
            data = objstore.read_bytes(fs, urls.join(root, fmt.MANIFEST), self.path, tries=1)
            return fmt.parse_manifest(data, self.path).fingerprint == self.manifest.fingerprint
        except (objstore.RemoteError, fmt.FormatError):
            return False

    def fetch(self, shard: int, wait: bool = True, stale: tuple | None = None, held: int | None = None) -> bool:
        """Make shard number `shard` present in the node's cache (download it unless it is there; `stale`: the
        identity of a cached copy to download again; `held`: its download lock, claimed; see `ShardCache.fetch`)."""
        return self.cache.fetch(self.shards[shard], self._getter(shard), self.shard_url(shard), wait=wait, stale=stale,
                                held=held)

    def waiting(self, shard: int) -> bool:
        """Whether reading the shard now would wait for a download under way (here or in another process)."""
        info = self.shards[shard]
        return not self.cache.present(info) and self.cache.downloading(info)

    def handle(self, shard: int, seen: list | None = None):
        """The shard's LMDB handle, downloaded and mapped first if needed; appends the identity of the cached copy
        it maps (or tried to) to `seen`."""
        if self._pid != os.getpid():
            self._forget()
        entry = self.maps.get(shard)
        if entry is not None:
            self.maps.move_to_end(shard)
            if seen is not None:
                seen.append(entry[1])
            return entry[2]
        info = self.shards[shard]
        missing = not self.cache.present(info)
        self._release_stale(keep=0 if missing else _KEEP_RECENT)   # about to wait for a download: hold nothing extra
        fd = self.cache.use(info)
        try:
            if missing:
                self.fetch(shard, wait=True)
            self.cache.touch(info)
            file = self.cache.file(info)
            st = os.stat(file)
            key = (st.st_dev, st.st_ino)
            if seen is not None:
                seen.append(key)
            try:
                h = handles.acquire(key, str(file))
            except handles.lmdb.Error as e:   # a damaged cached copy: damaged.read downloads it again
                raise handles.lmdb_failed(e, f"{self.shard_url(shard)} (cached at {file})") from None
        except BaseException:
            self.cache.unuse(fd)
            raise
        self.maps[shard] = (fd, key, h)
        return h

    def _release_stale(self, keep: int = _KEEP_RECENT) -> None:
        """Close the maps no order on the node pins, except the last `keep` used; with keep=0 every map (this
        process is about to wait for a download: what it holds must not be what keeps the cache full)."""
        if not self.maps or len(self.maps) < keep:
            return
        pinned = self.cache.pinned() if keep else frozenset()
        recent = list(self.maps)[-keep:] if keep else []
        for k in list(self.maps):
            if k not in recent and self.shards[k].file not in pinned:
                self.close_shard(k)

    def close_shard(self, k: int) -> None:
        fd, key, _ = self.maps.pop(k)
        handles.release(key)
        self.cache.unuse(fd)

    def close(self) -> None:
        if self._pid == os.getpid():
            for k in list(self.maps):
                self.close_shard(k)
            for p in self._read_aheads:
                p.stop()
        self.maps, self._read_aheads = OrderedDict(), []

    def shard_entries(self, shard: int) -> int:
        return self.handle(shard).env.stat()["entries"]

    # --- reads ------------------------------------------------------------------------------------------------
    def record(self, index: int, shard: int, check_crc: bool) -> Record:
        """Record `index` (in shard number `shard`), its shard downloaded into the node's cache first if needed. The
        record owns its bytes. A damaged cached copy is downloaded again once (`damaged.py`)."""
        return damaged.read(self, index, shard, check_crc)

    def missing(self) -> list:
        return []   # what the bucket holds is checked by downloading it (check_source)

    def check_source(self, shard: int) -> None:
        """Download the shard afresh from the bucket, replacing the cached copy: its size and sha256 are checked
        against the manifest (ShardDamaged when the bucket's copy is damaged)."""
        self.fetch(shard, stale=self.cache.identity(self.shards[shard]))

    def stored_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    # --- what the loaders' order needs ----------------------------------------------------------------------
    def default_read_ahead(self) -> int:
        """Shards downloaded ahead when nobody says (the room the windowed order leaves them): 2, or as many as make
        READ_AHEAD_BYTES when the shards are smaller (16 MB: a 1.3 Gb/s link's bandwidth x 100 ms), but never more
        than fill READ_AHEAD_SHARE of the cache's bytes at the mean size (the rest is the window, which mixes)."""
        sizes = [s.bytes for s in self.shards]
        if not sizes:
            return DEFAULT_READ_AHEAD
        mean = max(sum(sizes) / len(sizes), 1)
        want = math.ceil(READ_AHEAD_BYTES / mean)
        room = int(self.cache.limit * READ_AHEAD_SHARE / mean)
        return max(DEFAULT_READ_AHEAD, min(want, room, len(sizes)))

    def follower(self):
        """A new `ReadAhead` for one order: calling it (`want(now, upcoming)`) pins and downloads what the order
        needs; its `figures()` say what the link does."""
        from .read_ahead import ReadAhead

        ahead = ReadAhead(self)
        self._read_aheads.append(ahead)
        return ahead
