"""`LocalShards`: the shards of a store in a local folder, mapped with LMDB (the shard provider `Store` reads a
folder through; `remote/shards.py` is the one for a URL); what a path without a manifest is instead (`not_a_store`:
every command says the same)."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb

from . import changed, publish
from . import format as fmt
from .handles import acquire, lmdb_failed, release
from .record import Record, parse_record

_PACK = "create one with `fastfeed pack SRC -o OUT`"


def not_a_store(path: Path) -> fmt.NotAStore:
    """The error for a `path` without a manifest: missing, a file (a data.yaml: pack it), a folder."""
    if not path.exists():
        return fmt.NotAStore(f"{path} does not exist: not a fastfeed store ({_PACK})", path)
    if path.is_file():
        if path.suffix.lower() in (".yaml", ".yml"):
            return fmt.NotAStore(f"{path} is a dataset file (Ultralytics' data.yaml), not a fastfeed store: pack it "
                                 f"with `fastfeed pack {path} -o train.ff` (`--split val -o val.ff` for its val split), "
                                 "then pass the .ff folder", path)
        return fmt.NotAStore(f"{path} is a file, not a fastfeed store (a folder with {fmt.MANIFEST}; {_PACK})", path)
    if not path.is_dir():
        return fmt.NotAStore(f"{path} is not a folder: not a fastfeed store ({_PACK})", path)
    return fmt.NotAStore(f"{path / fmt.MANIFEST} not found: not a fastfeed store ({_PACK})", path)


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_mtime_ns


class LocalShards:
    """A folder's manifest and shards. Every shard is mapped on the first read in a process (each checked against the
    manifest's size first); a pack swapped in after that is refused (open the store again)."""

    remote = False          # reads are local (`source.ShardProvider`)
    cache = cache_limit = None   # every shard is here: nothing to hold in a cache
    read_ahead, read_ahead_given = None, False   # nor to download ahead

    def __init__(self, path):
        self.path = Path(path)
        publish.tidy(self.path)   # what an interrupted pack left: the old store put back, the rest removed
        manifest_path = self.path / fmt.MANIFEST
        if not manifest_path.is_file():
            if (pid := publish.pack_in_progress(self.path)) is not None:
                raise fmt.FormatError(f"{self.path} is being packed right now (fastfeed pack, pid {pid}): wait for "
                                      "the pack to finish, then open it")
            raise not_a_store(self.path)   # missing, a file, a data.yaml, a folder: each named, with what to do
        self.manifest = fmt.read_manifest(manifest_path)
        self._identity = _identity(manifest_path)
        self.shards = self.manifest.shards
        try:   # whether every shard had its packed size when the store was opened
            self._sound = all(os.stat(self.path / s.file).st_size == s.bytes for s in self.shards)
        except OSError:
            self._sound = False
        self._pid, self._handles, self._keys = None, [], []   # this process's maps: opened on the first read
        changed.register(self)

    @property
    def location(self) -> Path:
        return self.path

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("path", "manifest", "_identity", "shards", "_sound")}

    def __setstate__(self, state):
        self.__dict__.update(state)
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
            if st.st_size != s.bytes and self._sound:   # sound when opened: it changed under this store's readers
                raise fmt.StoreChanged(changed.under_reader([changed.resized(file, st.st_size, s.bytes)]))
            if st.st_size != s.bytes:  # reading a truncated map would kill us with SIGBUS
                raise fmt.FormatError(f"shard {s.file} of {self.path} is {st.st_size} bytes, the manifest "
                                      f"says {s.bytes}: truncated or replaced; re-pack or restore it")
            found.append(((st.st_dev, st.st_ino), str(file)))
        self._handles, self._keys = [], []
        try:
            for (key, file), s in zip(found, self.shards):
                try:
                    self._handles.append(acquire(key, file))
                except lmdb.Error as e:
                    raise fmt.FormatError(f"shard {s.file} of {self.path} cannot be opened ({e}); "
                                          "the store is damaged: re-pack it or restore the shard") from None
                self._keys.append(key)
            if self._repacked():   # swapped while we opened: these maps may mix two packs
                raise fmt.FormatError(f"the store at {self.path} was re-packed while this Store was opening it; "
                                      "open it again")
        except BaseException:
            for key in self._keys:
                release(key)
            self._handles, self._keys = [], []
            raise
        self._pid = os.getpid()

    def handle(self, shard: int):
        if self._pid != os.getpid():
            self._open()
        return self._handles[shard]

    def close(self) -> None:
        if self._pid == os.getpid():
            for key in self._keys:
                release(key)
        self._pid, self._handles, self._keys = None, [], []

    # --- shards -------------------------------------------------------------------------------------------------
    def shard_url(self, shard: int) -> str:
        return str(self.path / self.shards[shard].file)

    def fetch(self, shard: int, wait: bool = True) -> bool:
        return True   # a local shard is readable here

    def waiting(self, shard: int) -> bool:
        return False

    def shard_entries(self, shard: int) -> int:
        h = self.handle(shard)
        try:
            return h.env.stat()["entries"]
        except lmdb.Error as e:
            raise lmdb_failed(e, self.shard_url(shard)) from None

    def follower(self) -> None:
        return None   # nothing to download

    def missing(self) -> list:
        return [s for s in self.shards if not (self.path / s.file).is_file()]

    def check_source(self, shard: int) -> str | None:
        s = self.shards[shard]
        if s.sha256 and (digest := fmt.sha256_file(self.path / s.file)) != s.sha256:
            return f"sha256 {digest[:16]}..., the manifest says {s.sha256[:16]}...: the shard changed"
        return None

    def stored_bytes(self) -> int:
        return sum((self.path / s.file).stat().st_size for s in self.shards if (self.path / s.file).is_file())

    # --- reads --------------------------------------------------------------------------------------------------
    def record(self, index: int, shard: int, check_crc: bool) -> Record:
        """Record `index` (in shard number `shard`), a view into the map."""
        info, h = self.shards[shard], self.handle(shard)
        if (size := os.fstat(h.fd).st_size) != info.bytes:   # reading a shrunk map would kill us (SIGBUS)
            raise fmt.StoreChanged(f"record {index}: " + changed.under_reader(
                [changed.resized(self.path / info.file, size, info.bytes)]))
        try:
            buf = h.txn.get(fmt.record_key(index - info.start))
        except lmdb.Error as e:
            raise fmt.RecordCorrupt(f"{lmdb_failed(e, str(self.path / info.file), index)}; run `fastfeed verify` and "
                                    "re-pack") from None
        if buf is None:
            raise fmt.RecordCorrupt(f"record {index} missing from shard {info.file}; run `fastfeed verify` and re-pack")
        return parse_record(buf, index, info.file, check_crc)
