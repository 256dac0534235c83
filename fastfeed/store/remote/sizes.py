"""Where the shard cache lives and how large it may grow: directories, sizes, the built-in defaults (the
environment's are resolved at the entry points: `StoreOptions.from_env`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..options import CACHE_ENV, LIMIT_ENV  # noqa: F401 - the variables the cache's messages name

DEFAULT_DISK_SHARE = 0.8      # without a limit: this share of what the cache's disk could hold (free + the cache)
STORE_PREFIX = "store-"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def default_dir() -> Path:
    """The shard cache when none is given: ~/.cache/fastfeed/shards."""
    return Path.home() / ".cache" / "fastfeed" / "shards"


def parse_size(text, root: Path | None = None) -> int:
    """Bytes from `123`, `500M`, `50G`, `1.5T` (powers of 1024), or `40%` of the disk holding `root`."""
    bad = ValueError(f"shard cache limit {text!r} is not a size (e.g. 50G, 500M, 40%)")
    try:
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            value = int(text)
        elif (s := str(text).strip().lower().replace(" ", "")).endswith("%"):
            value = int(shutil.disk_usage(existing(root or default_dir())).total * float(s[:-1]) / 100)
        else:
            num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
            if s[len(num):] not in _UNITS or not num:
                raise bad
            value = int(float(num) * _UNITS[s[len(num):]])
    except (ValueError, OverflowError):   # '1.5.5G', 'inf%', 'nan%', '1e400M'
        raise bad from None
    if value <= 0:
        raise ValueError(f"shard cache limit must be > 0, got {text!r}")
    return value


def existing(p: Path) -> Path:
    p = Path(p)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def gib(n: float) -> str:
    """Bytes for a message: GiB from 1 GiB up, else MiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def human_bytes(n: float | None) -> str:
    """Bytes for a table (`fastfeed bench`, `fastfeed cache ls`): B, KiB, MiB, GiB or TiB; None: '-'."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
