"""What `fastfeed cache ls --shards` and `fastfeed cache clear --shards` do: list the stores in a shard cache,
remove those no process uses."""

from __future__ import annotations

import fcntl
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..publish import alive
from .locks import evict, fetched_in, held
from .sizes import STORE_PREFIX, default_dir


@dataclass
class ShardCacheInfo:
    path: Path
    url: str
    shards: int = 0
    bytes: int = 0
    in_use: int = 0
    pinned_by: list[int] = field(default_factory=list)
    downloads: int = 0
    downloaded_bytes: int = 0
    note: str = ""


def list_shard_caches(root=None) -> list[ShardCacheInfo]:
    """Every store in the shard cache at `root` (default: default_dir())."""
    root = Path(root or default_dir())
    out = []
    for d in sorted(root.glob(f"{STORE_PREFIX}*")):
        try:
            url = json.loads((d / "store.json").read_text()).get("url", "?")
        except (OSError, ValueError):
            url = "?"
        info = ShardCacheInfo(d, url)
        for f in d.glob("*.mdb"):
            info.shards += 1
            info.bytes += f.stat().st_size
            info.in_use += held(f.with_name(f.name + ".lock"), fcntl.LOCK_EX)
        pids = (f.name.split("-", 1)[0] for f in (d / "pins").glob("*.json"))
        info.pinned_by = sorted({int(pid) for pid in pids if pid.isdigit() and alive(int(pid))})
        fetched = fetched_in(d)
        info.downloads, info.downloaded_bytes = len(fetched), sum(x.get("bytes", 0) for x in fetched)
        out.append(info)
    return out


def clear_shard_caches(root=None, force: bool = False) -> tuple[list[ShardCacheInfo], list[ShardCacheInfo]]:
    """Remove every store's shards that no process uses or pins (all of them with `force`: a process still
    mapping one keeps reading it; the space comes back when it closes). Returns (removed, kept)."""
    removed, kept = [], []
    for info in list_shard_caches(root):
        if not force and (info.in_use or info.pinned_by):
            why = [f"{info.in_use} shard(s) in use" if info.in_use else "",
                   f"needed by pid(s) {', '.join(map(str, info.pinned_by))}" if info.pinned_by else ""]
            info.note = "; ".join(filter(None, why)) + " (--force removes it anyway)"
            kept.append(info)
            continue
        for f in info.path.glob("*.mdb"):
            if force or evict(f):
                f.unlink(missing_ok=True)
        if force or not any(info.path.glob("*.mdb")):
            shutil.rmtree(info.path, ignore_errors=True)
        removed.append(info)
    return removed, kept
