"""The one shape of a config's bad-value error, `<name> <rule>, got <value>`, and the number tests it uses
(a bool is not a number here). Standard library only: the CLI checks without importing torch."""

from __future__ import annotations

import numbers


def need(ok: bool, name: str, rule: str, value) -> None:
    """ValueError `<name> <rule>, got <value!r>` unless `ok`."""
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def field_need(obj, prefix: str):
    """`need` for `obj`'s fields, `check(ok, name, rule)`: the error names `<prefix><name>` and its value."""
    return lambda ok, name, rule: need(ok, prefix + name, rule, getattr(obj, name))
