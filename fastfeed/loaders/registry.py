"""The loader registry: `register_loader(name, factory)`, `create_loader(name, store, cfg, **options)`,
`list_loaders()`, `loader_info()`. The built-in loaders register themselves here on first use, as a loader
defined outside the package does."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import import_module

from .base import Loader, LoaderConfig
from .sampler import EpochOrder


@dataclass(frozen=True)
class LoaderInfo:
    """A registered loader: what `fastfeed loaders` lists."""

    name: str
    summary: str
    options: dict                  # option name -> default
    unavailable: str | None        # why it cannot run here, or None

    @property
    def available(self) -> bool:
        return self.unavailable is None


@dataclass(frozen=True)
class _Entry:
    factory: Callable
    options: type | None
    summary: str
    check: Callable[[], str | None] | None


_LOADERS: dict[str, _Entry] = {}
# name -> the module that registers it, imported on first use of the registry: importing fastfeed.loaders stays
# light (torch + numpy), so device code imports the Loader ABC
_BUILTIN = {"cpu": "pool", "shm": "shm", "dali": "dali", "device": "device"}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN.values():
            import_module(f"fastfeed.loaders.{module}")


def register_loader(name: str, factory: Callable | None = None, *, options: type | None = None, summary: str = "",
                    check: Callable[[], str | None] | None = None):
    """Register `factory(store, cfg, opts) -> Loader` under `name` (usable as a decorator); the built-in
    loaders register the same way, and so can one defined outside the package.

    `options`: the loader's own options, a dataclass whose fields have defaults and whose __post_init__
    validates them (None: the loader has none; the factory then gets opts=None). When the caller gives
    `create_loader` an `order`, the factory is called with `order=` too (pass it on to `Loader.__init__`; a
    factory without that keyword refuses orders). `check()`: why the loader cannot run on this machine (a
    missing package...), or None; it must be cheap.
    """
    def add(f):
        _load_builtins()
        if name in _LOADERS:
            raise ValueError(f"loader {name!r} is already registered")
        _LOADERS[name] = _Entry(f, options, summary, check)
        return f

    return add(factory) if factory is not None else add


def unregister_loader(name: str) -> None:
    """Take a loader out of the registry (a test's or a plugin's; the built-ins cannot be removed)."""
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in loader and cannot be unregistered")
    _LOADERS.pop(name, None)


def list_loaders() -> list[str]:
    _load_builtins()
    return sorted(_LOADERS)


def loader_info() -> list[LoaderInfo]:
    """Every registered loader with its options and whether it can run here (and why not)."""
    _load_builtins()
    return [LoaderInfo(name, e.summary, {f.name: f.default for f in fields(e.options)} if e.options else {},
                       e.check() if e.check else None) for name, e in sorted(_LOADERS.items())]


def loader_options(name: str, **options):
    """The options object of loader `name` from keyword arguments; unknown names raise ValueError
    saying which loader they belong to."""
    _load_builtins()
    if name not in _LOADERS:
        raise ValueError(f"unknown loader {name!r}; valid loaders: {', '.join(list_loaders())}")
    cls = _LOADERS[name].options
    known = {f.name for f in fields(cls)} if cls else set()
    for key in options:
        if key not in known:
            owners = [n for n, e in _LOADERS.items() if e.options and key in {f.name for f in fields(e.options)}]
            where = f"it is an option of: {', '.join(sorted(owners))}" if owners else "no loader has it"
            mine = f"{name}'s options: {', '.join(sorted(known))}" if known else f"{name} takes no options"
            raise ValueError(f"loader {name!r} has no option {key!r} ({where}); {mine}")
    return cls(**options) if cls else None


def create_loader(name: str, store, cfg: LoaderConfig | None = None, *, order: EpochOrder | None = None,
                  **options) -> Loader:
    """The loader `name` over `store`: `cfg` for what every loader shares, `options` for its own, `order`
    the batch order (default: `shard_order.default_order`, the store's own or the global shuffle)."""
    opts = loader_options(name, **options)
    if not hasattr(store, "record"):   # a path's len() is its characters: it would load as that many records
        hint = f"fastfeed.Store({str(store)!r})" if isinstance(store, (str, os.PathLike)) else "a fastfeed.Store"
        raise TypeError(f"create_loader reads a store, not {type(store).__name__} {store!r}: pass {hint}")
    if cfg is not None and not isinstance(cfg, LoaderConfig):
        raise TypeError(f"create_loader's cfg must be a LoaderConfig, got {type(cfg).__name__}: "
                        "LoaderConfig(**fields)")
    given = {} if order is None else {"order": order}   # a factory without the keyword refuses orders
    return _LOADERS[name].factory(store, cfg or LoaderConfig(), opts, **given)
