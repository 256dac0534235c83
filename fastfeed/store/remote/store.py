"""`RemoteStore`: a store in object storage (`Store("s3://bucket/coco.ff")`), read through the node's shard cache.

The manifest is read from the URL when the store is opened (small; the shards are not touched). A shard is
downloaded into the node-local shard cache (`shardcache.py`) the first time any process on the node needs
it, then opened with LMDB like a local shard. Each process maps only the shards it is reading: when it opens
another one it closes those that no order on the node pins and that are not among its last two, so the
cache can evict them. A remote store's records own their bytes (a copy out of the map), so closing a shard
never invalidates a record handed out.

Its `epoch_order` is what makes it fast: the global shuffle with every shard prefetched when the cache can
hold the whole store, else the shard-aware `loaders.windowed.WindowedOrder` sized to the cache; either one
followed (`FollowedOrder`) by a `Prefetcher` that pins the shards needed now and next and downloads them in
the background.
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from collections import OrderedDict

from .. import changed, handles, objstore
from .. import format as fmt
from ..reader import Store
from . import damaged
from .cache import ShardCache
from .sizes import default_dir, default_limit, parse_size

log = logging.getLogger(__name__)

DEPTH_ENV = "FASTFEED_PREFETCH_SHARDS"
DEFAULT_DEPTH = 2        # shards downloaded ahead of the ones being read, at least
LEAD_BYTES = 16 << 20    # ... and by default at least this much (small shards: more of them ahead)
_KEEP_RECENT = 2         # shards a process keeps mapped besides the pinned ones
_SPARE_SHARDS = 1        # cache room left for other readers (an evaluation store, a shm cache build)
_STORES: weakref.WeakSet = weakref.WeakSet()


def _forget_inherited() -> None:
    for s in list(_STORES):
        s._forget()


os.register_at_fork(after_in_child=_forget_inherited)


class RemoteStore(Store):
    """A store at a URL (any fsspec protocol). See the module docstring; the reads are `Store`'s.

    cache_dir: the node-local shard cache ($FASTFEED_SHARD_CACHE, else ~/.cache/fastfeed/shards);
    cache_limit: bytes or a size such as "50G" / "40%" ($FASTFEED_SHARD_CACHE_LIMIT, else 80% of what the
    disk can give); storage_options: fsspec options (credentials, endpoint; never written anywhere);
    prefetch_depth: shards downloaded ahead ($FASTFEED_PREFETCH_SHARDS; default `default_depth`: 2, more for
    shards under 8 MB).
    """

    def __init__(self, path, check_crc: bool = True, *, cache_dir=None, cache_limit=None, storage_options=None,
                 prefetch_depth: int | None = None):
        self.url = objstore.location(str(path))
        self.path = objstore.shown(self.url)
        self.storage_options = dict(storage_options or {})
        self.check_crc = check_crc
        fs, root = self._filesystem()
        where = objstore.join(self.path, fmt.MANIFEST)
        try:
            data = objstore.read_bytes(fs, objstore.join(root, fmt.MANIFEST), where, "reading the manifest")
        except objstore.RemoteMissing:
            raise fmt.FormatError(f"{self.path} is not a fastfeed store: it has no {fmt.MANIFEST} (it is being "
                                  f"packed, or was never packed: `fastfeed pack SRC -o {self.path}`)") from None
        self.manifest = fmt.parse_manifest(data, where)
        self.shards = self.manifest.shards
        self._starts = [s.start for s in self.shards]
        self._len = int(self.manifest.num_images)
        root_dir = default_dir() if cache_dir is None else cache_dir
        limit = default_limit(root_dir) if cache_limit is None else parse_size(cache_limit, root_dir)
        self.cache = ShardCache(root_dir, limit, self.url)
        self.cache.prepare()
        if prefetch_depth is None and (env := os.environ.get(DEPTH_ENV, "").strip()):
            try:
                prefetch_depth = int(env)
            except ValueError:
                raise ValueError(f"{DEPTH_ENV}={env!r}: give a whole number of shards to download ahead "
                                 "(or unset it for the default)") from None
        self.depth_given = prefetch_depth is not None
        depth = self.default_depth() if prefetch_depth is None else int(prefetch_depth)
        if depth < 0:
            raise ValueError(f"prefetch_depth must be >= 0, got {depth}")
        self.depth = depth
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._fs = None
        self._maps: OrderedDict = OrderedDict()   # shard number -> (lock fd, handle key, handle)
        self._prefetchers: list = []
        _STORES.add(self)
        changed.register(self)   # a cached shard truncated under a read is named (SIGBUS)

    def _forget(self) -> None:
        """In a forked child: the parent's maps and locks are not ours (closing our copy of a lock's fd leaves
        the parent's lock alone); nothing is released, everything reopens on use."""
        for fd, _, _ in self._maps.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._maps = OrderedDict()
        self._prefetchers = []
        self._fs = None
        self._pid = os.getpid()

    def _filesystem(self):
        if getattr(self, "_fs", None) is None:
            self._fs = objstore.filesystem(self.url, self.storage_options)
        return self._fs

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("url", "path", "storage_options", "check_crc", "manifest", "shards",
                                              "_starts", "_len", "cache", "depth", "depth_given")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return (f"Store({self.path!r}, images={len(self)}, classes={len(self.class_names)}, "
                f"cache={str(self.cache.root)!r})")

    def reopen(self) -> RemoteStore:
        return RemoteStore(self.url, check_crc=self.check_crc, cache_dir=self.cache.root, cache_limit=self.cache.limit,
                           storage_options=self.storage_options,
                           prefetch_depth=self.depth if self.depth_given else None)

    # --- shards -------------------------------------------------------------------------------------------
    def shard_url(self, shard: int) -> str:
        return objstore.join(self.path, self.shards[shard].file)

    def _getter(self, shard: int):
        info = self.shards[shard]
        fs, root = self._filesystem()
        where = self.shard_url(shard)

        def get(fd: int) -> None:
            try:
                objstore.download(fs, objstore.join(root, info.file), where, fd, info.bytes)
            except objstore.RemoteMissing:
                raise fmt.StoreChanged(f"shard {where} is gone: the store at {self.path} was re-packed (or its shards "
                                       "removed) after this Store read its manifest; open it again (Store(url)) to "
                                       "read the new pack") from None
        return get

    def fetch(self, shard: int, wait: bool = True, stale: tuple | None = None) -> bool:
        """Make shard number `shard` present in the node's cache (download it unless it is there; `stale`: the
        identity of a cached copy to download again, see `ShardCache.fetch`)."""
        return self.cache.fetch(self.shards[shard], self._getter(shard), self.shard_url(shard), wait=wait, stale=stale)

    def _handle(self, shard: int, seen: list | None = None):
        """The shard's LMDB handle, downloaded and mapped first if needed; appends the identity of the cached copy
        it maps (or tried to) to `seen`."""
        if self._pid != os.getpid():
            self._forget()
        entry = self._maps.get(shard)
        if entry is not None:
            self._maps.move_to_end(shard)
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
                h = handles._acquire(key, str(file))
            except handles.lmdb.Error as e:   # a damaged cached copy: damaged.read downloads it again
                raise handles.lmdb_failed(e, f"{self.shard_url(shard)} (cached at {file})") from None
        except BaseException:
            self.cache.unuse(fd)
            raise
        self._maps[shard] = (fd, key, h)
        return h

    def _release_stale(self, keep: int = _KEEP_RECENT) -> None:
        """Close the maps no order on the node pins, except the last `keep` used; with keep=0 every map (this
        process is about to wait for a download: what it holds must not be what keeps the cache full)."""
        if not self._maps or len(self._maps) < keep:
            return
        pinned = self.cache.pinned() if keep else frozenset()
        recent = list(self._maps)[-keep:] if keep else []
        for k in list(self._maps):
            if k not in recent and self.shards[k].file not in pinned:
                self._close_shard(k)

    def _close_shard(self, k: int) -> None:
        fd, key, _ = self._maps.pop(k)
        handles._release(key)
        self.cache.unuse(fd)

    def close(self) -> None:
        if self._pid == os.getpid():
            for k in list(self._maps):
                self._close_shard(k)
            for p in self._prefetchers:
                p.stop()
        self._maps, self._prefetchers = OrderedDict(), []

    def shard_entries(self, shard: int) -> int:
        return self._handle(shard).env.stat()["entries"]

    # --- reads ------------------------------------------------------------------------------------------------
    def record(self, index: int, check_crc: bool | None = None) -> fmt.Record:
        """Record `index` (as `Store.record`), its shard downloaded into the node's cache first if needed. The
        record owns its bytes. A damaged cached copy is downloaded again once (`damaged.py`)."""
        return damaged.read(self, int(index), check_crc)

    # --- the order ----------------------------------------------------------------------------------------------
    def default_depth(self) -> int:
        """Shards fetched ahead when nobody says: 2, or as many as make LEAD_BYTES when the shards are smaller
        (the lead must cover a download's latency and its share of the link while the shards ahead are read;
        with 4 MB shards two are a fraction of a second of training, with 128 MB ones seconds), but never more
        than a quarter of the shards the cache holds (the rest is the window, which is what mixes)."""
        sizes = [s.bytes for s in self.shards]
        if not sizes:
            return DEFAULT_DEPTH
        want = math.ceil(LEAD_BYTES / max(sum(sizes) / len(sizes), 1))
        room = self.cache.limit // max(max(sizes), 1) // 4
        return max(DEFAULT_DEPTH, min(want, room, len(sizes)))

    def fits(self) -> bool:
        """Whether the node's cache can hold the whole store (with room for one more shard)."""
        largest = max((s.bytes for s in self.shards), default=0)
        return sum(s.bytes for s in self.shards) + _SPARE_SHARDS * largest <= self.cache.limit

    def window_shards(self, lookback_records: int = 0, depth: int | None = None) -> int:
        """Shards the windowed order reads at once: the cache's limit in shards, less the ones being fetched ahead
        (`depth`, default the store's), those still read by the batches in flight (`lookback_records` of the
        node's stream, and one being left) and a spare."""
        largest = max((s.bytes for s in self.shards), default=1)
        per_shard = max(len(self) / max(len(self.shards), 1), 1)
        leaving = 1 + math.ceil(lookback_records / per_shard)
        return self.cache.limit // max(largest, 1) - (self.depth if depth is None else depth) - leaving - _SPARE_SHARDS

    def epoch_order(self, cfg, rank: int, world_size: int):
        from ...loaders.sampler import ShuffledOrder
        from ...loaders.windowed import FollowedOrder, WindowedOrder

        lookback = max(cfg.workers, 1) * cfg.prefetch + 1
        note = {"cache_limit": self.cache.limit, "store_bytes": sum(s.bytes for s in self.shards)}
        if not cfg.shuffle or self.fits():
            base = ShuffledOrder.for_loader(len(self), cfg, rank, world_size)
            depth = None if self.fits() else self.depth
        else:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
            depth = self.depth
            window = self.window_shards(lookback * cfg.batch_size * local, depth)
            if window < 1 and not self.depth_given and depth > DEFAULT_DEPTH:   # a tight cache: a shorter lead
                give = min(depth - DEFAULT_DEPTH, 1 - window)
                depth, window = depth - give, window + give
            if window < 1:
                largest = max(s.bytes for s in self.shards)
                need = (self.cache.limit // largest - window + 1) * largest
                raise ValueError(f"the shard cache limit ({self.cache.limit} bytes) holds fewer shards of {self.path} "
                                 f"than the windowed order needs: {depth} fetched ahead (prefetch_depth), those the "
                                 f"{lookback} batches in flight read, one read now and a spare: at least {need} bytes at "
                                 f"{largest} a shard. Raise the cache limit (FASTFEED_SHARD_CACHE_LIMIT or "
                                 "Store(url, cache_limit=...)), lower prefetch_depth, or re-pack with a smaller --shard-mb")
            base = WindowedOrder([(s.start, s.count) for s in self.shards], cfg.batch_size, window=window,
                                 seed=cfg.seed, rank=rank, world_size=world_size, local_world=local,
                                 drop_last=cfg.drop_last, shard_bytes=[s.bytes for s in self.shards])
        from .prefetch import Prefetcher

        prefetcher = Prefetcher(self)
        self._prefetchers.append(prefetcher)
        return FollowedOrder(base, self._starts, depth=depth, lookback=lookback, follow=prefetcher.want, note=note)
