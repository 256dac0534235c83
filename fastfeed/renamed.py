"""Old names kept for users of an earlier release: each still works, with a DeprecationWarning naming the new one.

`renamed(cls, old="new", ...)` on a class: `cls(old=...)` is `cls(new=...)`, `obj.old` reads `obj.new`, and
`translate(cls, kwargs)` maps keywords passed on (e.g. `Store(url, prefetch_depth=...)` to `StoreOptions`);
`old_flag(parser, "--old", "--new")` keeps a command-line flag's old spelling.
docs/design.md ("Vocabulary") says which name means what.
"""

from __future__ import annotations

import argparse
import functools
import warnings


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated: use {new} (same meaning, renamed)", DeprecationWarning,
                  stacklevel=stacklevel)


def old_flag(parser, old: str, new: str) -> None:
    """`old`, a flag's earlier spelling, still sets `new`'s value (hidden from --help); add it after `new`."""
    def value(text):
        warn(old, new)
        return text
    parser.add_argument(old, dest=new[2:].replace("-", "_"), type=value, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)


def translate(cls, kwargs: dict, stacklevel: int = 4) -> dict:
    """`kwargs` with `cls`'s old keyword names replaced by the new ones (each warns); both given: TypeError."""
    names = getattr(cls, "__renamed__", {})
    if not names.keys() & kwargs.keys():
        return kwargs
    out = dict(kwargs)
    for old, new in names.items():
        if old in out:
            if new in out:
                raise TypeError(f"{cls.__name__}: give {new} only ({old} is its old name)")
            warn(f"{cls.__name__}({old}=...)", f"{cls.__name__}({new}=...)", stacklevel)
            out[new] = out.pop(old)
    return out


def renamed(cls=None, *, keywords: bool = True, **names: str):
    """Class decorator: each `old="new"` keeps `obj.old` (read) and, with `keywords`, `cls(old=...)` working."""
    def apply(cls):
        cls.__renamed__ = {**getattr(cls, "__renamed__", {}), **names}
        for old, new in names.items():
            def read(self, old=old, new=new):
                warn(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{new}")
                return getattr(self, new)
            setattr(cls, old, property(read, doc=f"Deprecated: the old name of `{new}`."))
        if keywords:
            init = cls.__init__

            @functools.wraps(init)
            def __init__(self, *args, **kwargs):
                init(self, *args, **translate(cls, kwargs))
            cls.__init__ = __init__
        return cls
    return apply if cls is None else apply(cls)
