"""What `fastfeed cache ls` and `fastfeed cache clear` do: list slabs, remove the unused ones."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import layout, users
from .layout import probe, temp_files, users_path
from .users import CacheError

_NAME = re.compile(rf"^{layout.PREFIX}(?P<fp>[0-9A-Za-z]+)-(?P<imgsz>\d+)-v(?P<v>\d+){re.escape(layout.SUFFIX)}$")


@dataclass
class CacheInfo:
    path: Path                      # the slab (which may not exist: a build in progress, a lone lock file)
    state: str                      # complete | building | stale | lock only | reclaimed (its users all died)
    bytes: int = 0                  # on disk: the slab, or what temporary files hold
    fingerprint: str = ""
    imgsz: int = 0
    version: int = 0
    n_cached: int = 0
    n_records: int = 0
    users: list[int] = field(default_factory=list)
    keep: bool = False
    note: str = ""


def _slabs(cache_dir: Path) -> list[Path]:
    found = cache_dir.glob(f"{layout.PREFIX}*{layout.SUFFIX}*")
    bases = {p.name.split(layout.SUFFIX, 1)[0] + layout.SUFFIX for p in found}
    return [cache_dir / n for n in sorted(bases) if _NAME.match(n)]


def _describe(slab: Path) -> CacheInfo:
    m = _NAME.match(slab.name)
    info = CacheInfo(slab, "lock only", fingerprint=m["fp"], imgsz=int(m["imgsz"]), version=int(m["v"]))
    u = users.read_path(users_path(slab))
    info.users, info.keep = u.pids, u.keep
    if slab.exists():
        header, why = probe(slab)
        info.bytes = slab.stat().st_size
        if header is not None:
            info.state, info.n_cached, info.n_records = "complete", header.n_cached, header.n_records
        else:
            info.state, info.note = "stale", why
    for tmp, pid in temp_files(slab):
        live = users.alive(pid)
        if info.state == "lock only":
            info.state = "building" if live else "stale"
        info.bytes += tmp.stat().st_size if tmp.exists() else 0
        info.note = "; ".join(filter(None, [info.note, f"{'being built' if live else 'left half-written'} by pid "
                                                       f"{pid} ({tmp.name})"]))
    return info


def reclaim(cache_dir, spare: Path | None = None) -> list[CacheInfo]:
    """Remove the complete slabs whose users have all died (a loader killed with SIGKILL never detaches) and
    that nobody asked to keep; returns them (state "reclaimed"). A slab whose lock is held (being built or
    attached to right now) is left alone, and so is `spare` (the one a cache open is about to reuse). Run at every
    cache open and `fastfeed cache ls`."""
    out = []
    for slab in _slabs(Path(cache_dir)):
        if slab == spare:
            continue
        lock = users_path(slab)
        try:
            recorded = users.parse(lock.read_text("ascii", "replace"))
        except OSError:
            continue
        if not recorded.entries or recorded.keep or not slab.exists():
            continue
        try:
            with users.locked(lock, 0.0) as fd:
                u = users.read(fd)
                dead = sorted({p for p, _ in recorded.entries} - set(u.pids))
                if u.entries or u.keep or probe(slab)[0] is None:   # a live user, kept, or not a complete slab
                    continue
                info = _describe(slab)
                slab.unlink(missing_ok=True)
                lock.unlink(missing_ok=True)
        except (CacheError, OSError):
            continue
        info.state = "reclaimed"
        info.note = (f"every process that used it (pid {', '.join(map(str, dead))}) died without detaching: "
                     "reclaimed (removed)")
        out.append(info)
    return out


def check_folder(cache_dir: Path, write: bool = False) -> None:
    """CacheError unless `cache_dir` is a folder (one this process can write in, with `write`), saying why."""
    if cache_dir.is_dir() and (not write or os.access(cache_dir, os.W_OK)):
        return
    what = ("is read-only here" if cache_dir.is_dir() else
            "is a file, not a folder" if cache_dir.exists() else "does not exist")
    raise CacheError(f"the shm cache's folder {cache_dir} {what}: give an existing{', writable' * write} folder on a "
                     "tmpfs (the shm loader's option cache_dir, `--shm-dir`; /dev/shm is one on Linux)")


def list_caches(cache_dir="/dev/shm") -> list[CacheInfo]:
    """Every fastfeed cache slab in `cache_dir` (with builds in progress and leftovers), after removing those
    whose users all died (listed first, state "reclaimed")."""
    cache_dir = Path(cache_dir)
    check_folder(cache_dir)
    gone = reclaim(cache_dir)
    return gone + [_describe(s) for s in _slabs(cache_dir)]


def _remove(slab: Path, all_temps: bool) -> None:
    """The slab, its temporary files (those of dead builders only, unless `all_temps`) and its users file."""
    slab.unlink(missing_ok=True)
    for tmp, pid in temp_files(slab):
        if all_temps or not users.alive(pid):
            tmp.unlink(missing_ok=True)
    users_path(slab).unlink(missing_ok=True)


def clear_caches(cache_dir="/dev/shm", force: bool = False) -> tuple[list[CacheInfo], list[CacheInfo]]:
    """Remove every slab without live users (all of them with `force`); returns (removed, kept),
    the kept ones with the reason in `note`. Processes still using a force-removed slab keep
    their map (memory is freed when they exit); new ones cannot attach to it."""
    removed, kept = [], []
    infos = list_caches(cache_dir)
    if infos:   # nothing to remove is no error, wherever
        check_folder(Path(cache_dir), write=True)
    for info in infos:
        if info.state == "reclaimed":
            removed.append(info)
            continue
        try:
            with users.locked(users_path(info.path), 1.0) as fd:
                u = users.read(fd)
                if u.entries and not force:
                    users.write(fd, u)   # dead users pruned
                    info.users = u.pids
                    info.note = f"in use by pid(s) {', '.join(map(str, u.pids))} (--force removes it anyway)"
                    kept.append(info)
                    continue
                _remove(info.path, force)
        except CacheError:   # its lock is held for longer than a moment: it is being built
            if not force:
                info.note = "being built (--force removes it anyway)"
                kept.append(info)
                continue
            _remove(info.path, True)
        removed.append(info)
    return removed, kept
