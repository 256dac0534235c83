"""Pins: the shards each loader's order on the node needs now and next, one small file per order, read by every
process that evicts (nothing pinned by a live process is evicted by a read-ahead) or closes maps."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path

from ..publish import alive


def pins_of(store_dir: Path) -> frozenset:
    """Shard file names the orders of live processes pin in one store's part of the cache (dead ones' files go)."""
    names = set()
    for f in (store_dir / "pins").glob("*.json"):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not alive(d.get("pid")):
            with contextlib.suppress(OSError):   # a read-only cache keeps it
                f.unlink(missing_ok=True)
            continue
        names.update(d.get("shards", ()))
    return frozenset(names)


_PIN_IDS = itertools.count()


class PinFile:
    """What one loader's order in this process needs now and next, for every process on the node to see."""

    def __init__(self, cache):
        self.cache = cache
        self.path = cache.pins_dir / f"{os.getpid()}-{next(_PIN_IDS)}.json"
        self.names: tuple = ()

    def write(self, names) -> None:
        names = tuple(sorted(names))
        if names == self.names:
            return
        self.names = names
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps({"pid": os.getpid(), "shards": list(names)}))
            os.replace(tmp, self.path)

    def remove(self) -> None:
        self.names = ()
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
