"""Packing from and to object storage (the objects, the order of writes, the staging folders: docs/format.md, "A
store in object storage"; why: docs/design.md, "Publishing to a URL is ordered writes, not a rename").

From a bucket, the small files the layout readers read are downloaded beside sparse placeholders of every other
object, so `layout.open_source` reads the bucket's tree as a local one; the workers then read the images from the
bucket, many requests at once (`RemoteFiles.read`). To a bucket, each shard is uploaded as soon as it is complete,
under this pack's id, the manifest last. Staging folders (`pack-PID-x`, `source-PID-x`) a killed pack left are
removed by the next pack once that pid runs no more (`publish.alive`, the rule of the local pack's lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..store import format as fmt
from ..store import objstore, publish, urls
from .report import Problem
from .source import IMAGE_SUFFIXES, PackError

_SMALL_SUFFIXES = {".json", ".txt", ".yaml", ".yml"}   # what the layout readers read: downloaded while staging
_UPLOAD_THREADS = 4
_STAGING = re.compile(r"(?:pack|source)-(\d+)-\w+")   # a staging folder: its pack's pid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteFiles:
    """Where a staged source's placeholders are, and the bucket prefix they stand for (picklable: pack workers
    get it with their job)."""

    local: str
    url: str
    options: dict

    def url_of(self, path: Path) -> str:
        return urls.join(self.url, os.path.relpath(path, self.local))

    def shown(self, text: str) -> str:
        """`text` with the stand-in's paths as the bucket's URLs."""
        return text.replace(self.local, urls.shown(self.url))

    def read(self, items) -> dict:
        """{item.name: bytes or a Problem} for the items whose object is listed (a missing one has no placeholder
        and is reported by process_item as it reads the placeholder path)."""
        fs, root = objstore.filesystem(self.url, self.options)
        listed = [it for it in items if os.path.exists(it.path)]
        paths = {urls.join(root, os.path.relpath(it.path, self.local)): it for it in listed}
        got = objstore.fetch_many(fs, list(paths), lambda p: self.url_of(paths[p].path))
        out = {}
        for p, it in paths.items():
            if isinstance(v := got[p], objstore.RemoteError) and not isinstance(v, objstore.RemoteMissing):
                raise PackError(f"{v}; the source could not be read, not an image: nothing was written (run the pack "
                                "again once the bucket is reachable)")   # an outage is not a smaller dataset
            out[it.name] = v if isinstance(v, bytes) else Problem("unreadable_image", it.name, str(v)[:300])
        return out


@contextlib.contextmanager
def staged(src: str, options: dict | None):
    """(local stand-in of `src` for the layout readers, RemoteFiles) while inside; the stand-in is removed after."""
    url = urls.location(src)
    top_url, yaml_name = url.rsplit("/", 1) if url.lower().endswith((".yaml", ".yml")) else (url, None)
    fs, root = objstore.filesystem(top_url, options)
    listing = _list(fs, root, top_url)
    if not listing:
        raise PackError(f"{urls.shown(top_url)} holds no objects: expected a COCO or YOLO dataset there")
    tmp = staging_dir("source")
    try:
        small = []
        for key, size in listing.items():
            rel = key[len(root):].lstrip("/")
            if not rel or rel.endswith("/"):
                continue
            local = tmp / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            if Path(rel).suffix.lower() in _SMALL_SUFFIXES and Path(rel).suffix.lower() not in IMAGE_SUFFIXES:
                small.append((key, local))
                continue
            with open(local, "wb") as f:
                f.truncate(size)   # sparse: the size the readers estimate shards from, no data
        got = objstore.fetch_many(fs, [k for k, _ in small], lambda k: urls.join(top_url, k[len(root):].lstrip("/")))
        for key, local in small:
            data = got[key]
            if not isinstance(data, bytes):
                raise data
            local.write_bytes(data)
        yield (tmp / yaml_name if yaml_name else tmp), RemoteFiles(str(tmp), top_url, dict(options or {}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _list(fs, root: str, url: str) -> dict[str, int]:
    """{object key: size} under `root`: its first two levels of folders listed in parallel."""
    def ls(path, op=fs.ls):
        return objstore.retry(lambda: op(path, detail=True), urls.join(url, path[len(root):]), "listing", fs=fs)

    top = ls(root)
    files = {e["name"]: int(e.get("size") or 0) for e in top if e.get("type") == "file"}
    dirs = [e["name"] for e in top if e.get("type") == "directory"]
    second = []
    with ThreadPoolExecutor(16, thread_name_prefix="fastfeed-list") as pool:
        for entries in pool.map(ls, dirs):
            files.update({e["name"]: int(e.get("size") or 0) for e in entries if e.get("type") == "file"})
            second += [e["name"] for e in entries if e.get("type") == "directory"]
        for found in pool.map(lambda path: ls(path, fs.find), second):
            files.update({k: int(v.get("size") or 0) for k, v in found.items() if v.get("type") != "directory"})
    return files


# --- to a bucket --------------------------------------------------------------------------------------------------

def _packs_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / "fastfeed-url-packs"
    folder.mkdir(exist_ok=True)
    return folder


def stand_in_lock_path(url: str) -> Path:
    """A local path whose pack lock (`.NAME.lock` beside it) keeps two packs on this machine out of one URL."""
    return _packs_dir() / hashlib.sha256(url.encode()).hexdigest()[:16]


def staging_dir(kind: str) -> Path:
    """A new folder for this pack's local files (`kind`: "pack", the shards before upload; "source", a bucket's
    stand-in), in the known staging place, named with this pid; what dead packs left there is removed first."""
    root = _packs_dir() / "staging"
    root.mkdir(exist_ok=True)
    remove_dead_staging(root)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=root))


def remove_dead_staging(root: Path) -> list[Path]:
    """Remove the staging folders under `root` whose pack no longer runs (its pid is gone); returns them."""
    removed = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        m = _STAGING.fullmatch(p.name)
        if m is None or int(m.group(1)) == os.getpid() or publish.alive(int(m.group(1))):
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not os.path.lexists(p):
            log.warning("removed %s, left by a pack (pid %s) that was killed", p, m.group(1))
            removed.append(p)
    return removed


class Destination:
    """A store at a URL being written: `existing()` (the pack it replaces), `add_shard` (uploads in the
    background), `finish` (rejects, then the manifest, then the old shards removed)."""

    def __init__(self, url: str, options: dict | None):
        self.url = url
        self.where = urls.shown(url)
        self.fs, self.root = objstore.filesystem(url, options)
        self.pool = ThreadPoolExecutor(_UPLOAD_THREADS, thread_name_prefix="fastfeed-upload")
        self.pending: list = []
        self.uploaded: list[str] = []
        self._lock = threading.Lock()

    def key(self, name: str) -> str:
        return urls.join(self.root, name)

    def existing(self) -> fmt.Manifest | None:
        """The manifest there now (None: no store). Refuses a prefix holding other objects but no store."""
        try:
            data = objstore.read_bytes(self.fs, self.key(fmt.MANIFEST), urls.join(self.where, fmt.MANIFEST))
        except objstore.RemoteMissing:
            names = self._names()
            others = [n for n in names if not (n.startswith("shard-") and n.endswith(".mdb")) and n != fmt.REJECTS]
            if others:
                raise PackError(f"refusing to write a store into {self.where}: it holds other objects ({', '.join(others[:3])}"
                                f"{', ...' if len(others) > 3 else ''}) and no fastfeed store; choose an empty prefix") from None
            return None
        return fmt.parse_manifest(data, urls.join(self.where, fmt.MANIFEST))

    def _names(self) -> list[str]:
        try:
            found = objstore.retry(lambda: self.fs.find(self.root), self.where, "listing", fs=self.fs)
        except objstore.RemoteMissing:
            return []
        return [k[len(self.root):].lstrip("/") for k in found]

    def add_shard(self, local: Path, name: str) -> None:
        for f in self.pending:   # an upload that failed stops the pack now, not at the end
            if f.done() and f.exception() is not None:
                raise f.exception()

        def up():
            objstore.upload(self.fs, local, self.key(name), urls.join(self.where, name))
            local.unlink(missing_ok=True)
            with self._lock:
                self.uploaded.append(name)
        self.pending.append(self.pool.submit(up))

    def put(self, name: str, data: bytes) -> None:
        objstore.write_bytes(self.fs, self.key(name), data, urls.join(self.where, name))

    def put_rejects(self, data: bytes, beside: bool) -> str:
        """Every image rejected: the reasons go into URL/rejects.jsonl, or beside a store that stays as it was
        (`URL.rejects.jsonl`); returns where, as shown."""
        key = f"{self.root}.{fmt.REJECTS}" if beside else self.key(fmt.REJECTS)
        where = f"{self.where}.{fmt.REJECTS}" if beside else urls.join(self.where, fmt.REJECTS)
        objstore.write_bytes(self.fs, key, data, where)
        return where

    def finish(self, manifest: fmt.Manifest, rejects: Path) -> None:
        """rejects.jsonl, the manifest (now the store is the new one), then every shard it does not name."""
        try:
            for f in self.pending:   # every upload ended first (a failed one raises here)
                f.result()
        finally:
            self.pending = []
        self.put(fmt.REJECTS, rejects.read_bytes())
        self.put(fmt.MANIFEST, fmt.manifest_bytes(manifest))
        keep = {s.file for s in manifest.shards}
        self._remove([n for n in self._names() if n.startswith("shard-") and n.endswith(".mdb") and n not in keep])

    def abandon(self) -> None:
        """A failed pack: remove the shards it uploaded (nothing names them); the old store is untouched."""
        for f in self.pending:
            f.cancel()
        for f in self.pending:   # every upload still running has ended before its shard is removed
            with contextlib.suppress(BaseException):
                f.result()
        self.pending = []
        self._remove(list(self.uploaded))
        self.pool.shutdown(wait=False)

    def _remove(self, names: list[str]) -> None:
        if names:
            with contextlib.suppress(Exception):   # a leftover is removed by the next pack into this URL
                objstore.retry(lambda: self.fs.rm([self.key(n) for n in names]), self.where, "removing old shards from",
                               fs=self.fs)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
