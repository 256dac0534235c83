"""Write one LMDB shard and, when every shard is written, the manifest (counts, classes, shards, the content
fingerprint, the source, the report); hold OUT's pack lock (`store/publish.py` moves a finished store into place)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import lmdb

from .. import __version__, tasks
from ..store import format as fmt
from ..store import publish
from ..store.remote.sizes import gib
from .report import PackReport
from .source import PackError

log = logging.getLogger(__name__)

_MAP_SIZE = 1 << 40          # address space only: the file grows with what is written
_COMMIT_EVERY_BYTES = 64 << 20


class ShardWriter:
    """Appends records to one shard file (created on the first record), keys 0, 1, 2, ..."""

    def __init__(self, path: Path):
        self.path = path
        self.count = self._pending = 0   # records written; their bytes since the last commit
        self._env = self._txn = None

    def append(self, record: bytes) -> None:
        if self._env is None:
            self._env = lmdb.open(str(self.path), subdir=False, map_size=_MAP_SIZE, lock=False,
                                  sync=False, metasync=False, readahead=False, meminit=False)
            self._txn = self._env.begin(write=True)
        self._txn.put(fmt.record_key(self.count), record, append=True)
        self.count += 1
        self._pending += len(record)
        if self._pending >= _COMMIT_EVERY_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = 0

    def close(self) -> dict | None:
        """Commit and fsync; returns {file, count, bytes, sha256}, or None when nothing was written."""
        if self._env is None:
            return None
        self._txn.commit()
        self._env.sync(True)  # the store is published by a rename: its data must be on disk first
        self._env.close()
        self._env = self._txn = None
        return {"file": self.path.name, "count": self.count, "bytes": os.path.getsize(self.path),
                "sha256": fmt.sha256_file(self.path)}

    def abort(self) -> None:
        if self._env is not None:
            self._txn.abort()
            self._env.close()
            self._env = self._txn = None


@contextlib.contextmanager
def pack_lock(out: Path, wait: bool = False):
    """Hold OUT's pack lock (`store.publish.locked`) for the whole pack, or raise PackError at once when
    another pack holds it: two packs into one OUT learn it before either does any work. With `wait`, wait for
    the other holder instead (FastfeedTrainer's processes waiting for one pack). Under the lock, what an
    interrupted pack left beside OUT is put back or removed first (`store.publish.recover`)."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(publish.locked(out, settle_s=publish.SETTLE_S, wait=wait))
        except publish.LockBusy as e:
            if publish.alive(e.pid):
                raise PackError(f"another fastfeed pack (pid {e.pid}) is writing {out}: wait for it to finish, or "
                                "pack into another -o") from None
            raise PackError(f"{fmt.pack_lock_path(out)} is locked, but not by a pack running on this machine"
                            f"{f' (the pack that took it, pid {e.pid}, has ended: its worker processes?)' if e.pid else ''}"
                            ": stop what holds it (a pack on another machine?), or pack into another -o") from None
        except OSError as e:
            raise PackError(f"cannot write beside {out}: {e}") from None
        for line in publish.recover(out):
            log.info("%s", line)
        yield


_FULL_ERRNOS = {errno.ENOSPC: "no space left", errno.EDQUOT: "the disk quota is exhausted"}


def _written(tmp: Path) -> int:
    total = 0
    for root, _, files in os.walk(tmp):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


@dataclass(frozen=True)
class DiskSpace:
    """Free space where a pack writes, taken when it starts, to tell a full disk from other write errors."""

    folder: Path
    free: int

    @classmethod
    def at(cls, folder: Path) -> DiskSpace:
        st = os.statvfs(folder)
        return cls(folder, st.f_bavail * st.f_frsize)

    def full_error(self, e: BaseException, tmp: Path, out: Path, replacing: bool, need: int) -> str | None:
        """The message for `e` when it was the disk filling up (call before `tmp` is removed), else None.

        LMDB reports a short write as EIO ("mdb_txn_commit: Input/output error"), so an LMDB or I/O error is
        taken for a full disk when less than two commits' worth of space is left."""
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            what = _FULL_ERRNOS[e.errno]
        elif isinstance(e, (lmdb.Error, OSError)) and not isinstance(e, (FileNotFoundError, PermissionError)):
            try:
                now = DiskSpace.at(self.folder).free
            except OSError:
                return None
            if now >= 2 * _COMMIT_EVERY_BYTES:
                return None
            what = f"{gib(now)} left"
        else:
            return None
        kept = f"{out} is as it was" if replacing or out.exists() else f"nothing was written to {out}"
        kind = type(e).__name__ if type(e).__module__ == "builtins" else f"{type(e).__module__}.{type(e).__name__}"
        return (f"the disk holding {self.folder} is full ({what}; {kind}: {e}): the pack needs about "
                f"{gib(need)} for its records (estimated from the source files), {gib(self.free)} was free when it "
                f"started, and it had written {gib(_written(tmp))}. Free space there, or pack onto a disk with room "
                f"(-o elsewhere); {kept}, and the partial store was removed")


def build_manifest(cfg, source, shards: list[dict], stats, report: PackReport, workers: int) -> fmt.Manifest:
    names, cat_ids = source.class_names, source.category_ids
    if not names:  # YOLO without data.yaml: classes are whatever ids the labels use
        nc = max(stats.class_boxes, default=-1) + 1
        names, cat_ids = [str(i) for i in range(nc)], list(range(nc))
    source_hash = hashlib.sha256()
    for name, crc in stats.sources:
        source_hash.update(f"{name}\0{crc}\n".encode())
    for ann in source.annotation_files:
        source_hash.update(hashlib.sha256(ann.read_bytes()).digest())
    task = source.task
    keypoints = tasks.get(task.name).keypoints
    kpt_shape = list(task.kpt_shape) if keypoints else None
    flip_idx = source.flip_idx if keypoints else None
    content = (f"{fmt.FORMAT_VERSION}:{cfg.store}:{cfg.max_side}:{cfg.quality}:{names}:{task.name}:{kpt_shape}:"
               f"{flip_idx}").encode() + bytes(stats.record_crcs)
    return fmt.Manifest(
        num_images=sum(s["count"] for s in shards), num_boxes=stats.num_boxes, num_crowd=stats.num_crowd,
        classes=names, category_ids=cat_ids,
        payload={"store": cfg.store, "max_side": cfg.max_side, "quality": cfg.quality if cfg.store == "jpeg" else None},
        shards=[fmt.ShardInfo(**s) for s in shards],
        fingerprint=hashlib.sha256(content).hexdigest()[:32],
        source={"format": source.format, "root": str(source.root.resolve()), "split": source.split,
                "annotations": [str(a.resolve()) for a in source.annotation_files],
                "images_seen": len(source.items), "fingerprint": source_hash.hexdigest()[:32]},
        pack_options={k: v for k, v in asdict(cfg).items()
                      if k in ("shards", "shard_mb", "on_error", "format", "split", "check", "max_pixels", "exif",
                                   "coco_boxes", "task")}
                     | {"workers": workers},
        stats={"class_boxes": [stats.class_boxes.get(c, 0) for c in range(len(names))],
               "sizes": dict(stats.sizes.most_common()), "record_bytes": stats.record_bytes,
               "oriented": stats.oriented, "geometry": dict(stats.geometry)},
        report=report.to_dict(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), fastfeed_version=__version__,
        task=task.name, kpt_shape=kpt_shape, flip_idx=flip_idx)
