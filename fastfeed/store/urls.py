"""Locations: whether a store or dataset is named by a URL (object storage) or is a local path, and how a URL
is shown (never with a user:password part). Plain strings, no I/O: reading a URL is `objstore.py`'s."""

from __future__ import annotations

import re
from pathlib import Path

_URL = re.compile(r"^(?P<proto>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>.*)$")


def protocol(url: str) -> str | None:
    """The `proto` of `proto://...`, or None when `url` is not one."""
    m = _URL.match(url)
    return m["proto"] if m else None


def is_url(x) -> bool:
    """Whether `x` names something in object storage (a `proto://` URL other than `file://`)."""
    return isinstance(x, str) and (protocol(x) or "file").lower() not in ("file", "local")


def location(x):
    """A store or dataset location as given: a URL stays a string (without a trailing '/'), anything else a
    Path (`Path('s3://b/x')` would lose a slash)."""
    if x is None:
        return None
    if isinstance(x, str) and is_url(x):
        return x.rstrip("/")
    if isinstance(x, str) and x.startswith("file://"):
        return Path(x[len("file://"):])
    return Path(x)


def shown(url: str) -> str:
    """`url` as it may appear in a message or a manifest: any user:password@ removed."""
    m = _URL.match(url)
    if not m:
        return url
    host, sep, tail = m["rest"].partition("/")
    return f"{m['proto']}://{host.rsplit('@', 1)[-1]}{sep}{tail}"


def join(url: str, *names: str) -> str:
    return "/".join([url.rstrip("/"), *names])


def bucket_of(url: str) -> str:
    m = _URL.match(url)
    return f"{m['proto']}://{m['rest'].split('/', 1)[0]}" if m else url
