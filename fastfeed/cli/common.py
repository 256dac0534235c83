"""What every subcommand shares: exit codes and the error line."""

from __future__ import annotations

import sys
from dataclasses import MISSING, fields

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def fail(message: str, code: int = EXIT_FAIL) -> int:
    print(f"fastfeed: error: {message}", file=sys.stderr)
    return code


def default(cls, name: str):
    """The default of dataclass field `name`, so a flag's default is written once, in the config."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            raise ValueError(f"{cls.__name__}.{name} has no default")
    raise ValueError(f"{cls.__name__} has no field {name!r}")
