"""`StoreOptions`: how a store at a URL is read on this node, passed to `Store(path, options=...)`; a field not
given takes its built-in default (the store reads no environment). The entry points (the CLI, the Ultralytics
integration) fill the fields not given from the process environment, once (`StoreOptions.from_env`):

    shard_cache       $FASTFEED_SHARD_CACHE, else $XDG_CACHE_HOME/fastfeed/shards (default ~/.cache/fastfeed/shards)
    shard_cache_limit $FASTFEED_SHARD_CACHE_LIMIT: 50G, 500M, 40% (default 80% of what the disk can give)
    read_ahead        $FASTFEED_READ_AHEAD_SHARDS (its old name $FASTFEED_PREFETCH_SHARDS warns): most shards
                      downloaded ahead of the ones being read (default sized by the link within the cache)
    storage_options   $FASTFEED_STORAGE_OPTIONS (JSON) under the ones given: fsspec options (credentials, endpoint)
    retries           tries of one object-storage read, the first included (default `objstore.RETRIES`)

The options travel with the Store into worker processes; nothing is written into the environment, and storage
options never into a manifest, a checkpoint or a log line (`__repr__` hides them). The old names `prefetch_depth`
(`read_ahead`), `cache_dir` (`shard_cache`) and `cache_limit` (`shard_cache_limit`) still work (a DeprecationWarning).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ..checks import is_int, need
from ..renamed import renamed, translate, warn

CACHE_ENV = "FASTFEED_SHARD_CACHE"
LIMIT_ENV = "FASTFEED_SHARD_CACHE_LIMIT"
READ_AHEAD_ENV = "FASTFEED_READ_AHEAD_SHARDS"
OLD_READ_AHEAD_ENV = "FASTFEED_PREFETCH_SHARDS"   # its old name, still read (a DeprecationWarning)
OPTIONS_ENV = "FASTFEED_STORAGE_OPTIONS"


@renamed(prefetch_depth="read_ahead", cache_dir="shard_cache", cache_limit="shard_cache_limit")
@dataclass(frozen=True)
class StoreOptions:
    shard_cache: Path | str | None = None
    shard_cache_limit: int | str | None = None
    read_ahead: int | None = None
    storage_options: dict = field(default_factory=dict, repr=False)
    retries: int | None = None

    @classmethod
    def of(cls, options: StoreOptions | None = None, **given) -> StoreOptions:
        """`options` with the keyword arguments given (not None) over it; an unknown keyword is a TypeError."""
        given = translate(cls, given, stacklevel=5)
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(given) - known):
            raise TypeError(f"unknown store option(s) {', '.join(unknown)}: give {', '.join(sorted(known))}")
        base = options if options is not None else cls()
        return replace(base, **{k: v for k, v in given.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str], options: StoreOptions | None = None, **given) -> StoreOptions:
        """`of(options, **given)` with each field still None taken from `environ` (the module docstring): what an
        entry point calls once with the process environment. A bad variable is a ValueError naming it."""
        opts = cls.of(options, **given)
        env = {k: v.strip() for k, v in environ.items() if k.startswith(("FASTFEED_", "XDG_")) and v.strip()}
        found = {}
        if opts.shard_cache is None and (CACHE_ENV in env or "XDG_CACHE_HOME" in env):
            found["shard_cache"] = env.get(CACHE_ENV) or str(Path(env["XDG_CACHE_HOME"]) / "fastfeed" / "shards")
        if opts.shard_cache_limit is None and LIMIT_ENV in env:
            found["shard_cache_limit"] = env[LIMIT_ENV]
        name = READ_AHEAD_ENV if READ_AHEAD_ENV in env else OLD_READ_AHEAD_ENV
        if opts.read_ahead is None and name in env:
            if name == OLD_READ_AHEAD_ENV:
                warn(f"${name}", f"${READ_AHEAD_ENV}")
            if not env[name].isdigit():
                raise ValueError(f"{name}={env[name]!r}: give a whole number of shards >= 0 to download ahead (or "
                                 "unset it for the default)")
            found["read_ahead"] = int(env[name])
        if OPTIONS_ENV in env:
            found["storage_options"] = _json_options(env[OPTIONS_ENV]) | opts.storage_options
        return replace(opts, **found)

    def __post_init__(self):
        if self.read_ahead is not None:
            object.__setattr__(self, "read_ahead", int(self.read_ahead))
            need(self.read_ahead >= 0, "read_ahead", "must be >= 0", self.read_ahead)
        need(self.retries is None or (is_int(self.retries) and self.retries >= 1), "retries",
             "must be a whole number of tries >= 1 (1: no retry)", self.retries)
        object.__setattr__(self, "storage_options", dict(self.storage_options or {}))


def _json_options(text: str) -> dict:
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"${OPTIONS_ENV} is not a JSON object ({e}); e.g. {OPTIONS_ENV}='{{\"anon\": true}}'") from None
    if not isinstance(opts, dict):
        raise ValueError(f"${OPTIONS_ENV} must be a JSON object, got {type(opts).__name__}")
    return opts
