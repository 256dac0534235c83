"""Object storage through fsspec: file systems, retries, and errors that say what to do.

Every read or write of a store or a dataset in a bucket (`s3://`, `gs://`, `az://`, any fsspec protocol) goes
through here (what a location is, and how a URL is shown: `urls.py`). Credentials and endpoints come the standard
ways: the environment (`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `AWS_ENDPOINT_URL`, `GOOGLE_APPLICATION_CREDENTIALS`,
...), the cloud's profile files, and fsspec `storage_options` (`options.py`: how they are given; never written).

`retry` runs one operation with bounded exponential backoff on transient failures (connection resets, timeouts,
5xx, throttling). A missing object, a missing bucket, missing credentials and a refused access are not transient:
each becomes one line that says what to do (`RemoteError`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .format import FormatError
from .urls import bucket_of, protocol, shown

log = logging.getLogger(__name__)

RETRIES = 6                  # tries of one operation (the first and five retries)
BACKOFF_S = (0.2, 8.0)       # the first wait, the longest
PART_BYTES = 16 << 20        # ranged reads of a large object: parts of this size, fetched in parallel
PART_THREADS = 8
CONNECTIONS = 32             # an S3 client's connection pool: the most downloads in flight at once
# botocore's pool (its 10 would queue the read-ahead's downloads), timeouts and tries, and s3fs's tries: `retry` tries
# again, so they barely do (their 5 tries each, 60 s timeouts, under ours kept a silent endpoint waiting for hours).
# The storage option config_kwargs overrides each.
S3_CONFIG = {"max_pool_connections": CONNECTIONS, "connect_timeout": 10, "read_timeout": 30,
             "retries": {"total_max_attempts": 2}}
S3FS_RETRIES = 1
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
           "adl": "azure"}


class RemoteError(FormatError):
    """Object storage that cannot be read or written as asked (the message says what to do)."""


class RemoteMissing(RemoteError):
    """An object that is not there (the bucket is)."""


class RemoteShort(RemoteError):
    """An object shorter than the bytes asked of it (`have`): the object itself, not a connection cut short."""

    def __init__(self, message: str, have: int = -1):   # (a default: an exception is unpickled from its message)
        super().__init__(message)
        self.have = have


def parse_option(text: str) -> tuple[str, object]:
    """`KEY=VALUE` of `--storage-option`: VALUE read as JSON when it is (true, 3, {"a": 1}), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--storage-option wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as e:
        if value.lstrip()[:1] in ("{", "["):   # meant as JSON: a mapping read as a string fails deep in the client
            raise ValueError(f"--storage-option {key}: {value!r} is not valid JSON ({e})") from None
        return key, value


def filesystem(url: str, options: dict | None = None):
    """(fsspec file system, the path within it) for `url`. A protocol whose package is missing is an
    ImportError naming the extra to install."""
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading {shown(url)} needs fsspec: pip install -e '.[{extra_of(url)}]' in the fastfeed checkout") from None
    opts = dict(options or {})
    if extra_of(url) == "s3":   # S3_CONFIG: room for the downloads in flight, bounded waits
        opts["config_kwargs"] = S3_CONFIG | dict(opts.get("config_kwargs") or {})
    try:
        fs, path = fsspec.core.url_to_fs(url, **opts)
        if extra_of(url) == "s3":
            fs.retries = min(getattr(fs, "retries", S3FS_RETRIES), S3FS_RETRIES)
    except ImportError as e:
        raise ImportError(f"reading {shown(url)} needs the package for its protocol ({e}): "
                          f"pip install -e '.[{extra_of(url)}]' in the fastfeed checkout") from None
    except ValueError as e:
        raise RemoteError(f"{shown(url)}: {e}") from None
    return fs, path


def extra_of(url: str) -> str:
    """The family of `url`'s store (s3, gcs, azure): the pip extra that reads it."""
    return _EXTRAS.get((protocol(url) or "s3").lower(), "s3")


# --- failures ---------------------------------------------------------------------------------------------------

_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError", "DefaultCredentialsError",
                      "ClientAuthenticationError", "CredentialRetrievalError", "UnauthorizedSSOTokenError")


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def kind(e: BaseException) -> str:
    """'credentials' | 'denied' | 'missing' | 'full' | 'fatal' (a bug or bad arguments) | 'transient'."""
    if any(type(x).__name__ in _CREDENTIAL_ERRORS for x in _chain(e)):
        return "credentials"
    if isinstance(e, PermissionError):
        return "denied"
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return "missing"
    if isinstance(e, OSError) and e.errno == 28:   # ENOSPC, on our side
        return "full"
    if isinstance(e, (ValueError, TypeError, AttributeError, KeyError, ImportError, NotImplementedError, RemoteError)):
        return "fatal"
    return "transient"


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def explain(e: BaseException, url: str, what: str, fs=None) -> RemoteError:
    """The one-line error for a failure that is not worth retrying (or that kept failing)."""
    k, where = kind(e), shown(url)
    if k == "credentials":
        return RemoteError(f"{what} {where}: no credentials found ({_describe(e)}). Give them the standard way: "
                           "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment for S3, "
                           "GOOGLE_APPLICATION_CREDENTIALS for GCS, AZURE_STORAGE_* for Azure, or storage options "
                           "(--storage-option key=... / storage_options=); --storage-option anon=true for a public "
                           "bucket")
    if k == "denied":
        return RemoteError(f"{what} {where}: access denied ({_describe(e)}): check that the credentials are right "
                           "and allowed to read (and, to pack, write) this bucket")
    if k == "missing":
        bucket = bucket_of(url)
        if fs is not None and not _bucket_exists(fs, bucket):
            return RemoteError(f"{what} {where}: the bucket {shown(bucket)} does not exist (or these credentials "
                               "cannot see it): create it, or fix the URL (and AWS_ENDPOINT_URL for an S3-compatible "
                               "store)")
        return RemoteMissing(f"{what} {where}: not found")
    if k == "full":
        return RemoteError(f"{what} {where}: {e}")
    return RemoteError(f"{what} {where} failed ({_describe(e)})")


def _bucket_exists(fs, bucket: str) -> bool:
    try:
        return bool(fs.exists(bucket.split("://", 1)[1]))
    except Exception:   # noqa: BLE001 - asking is only for a better message
        return True


def backoff_s(tries: int) -> float:
    """The most seconds `tries` tries of one operation wait between them (before the jitter, which only shortens)."""
    return sum(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** a) for a in range(tries - 1))


def retry(op: Callable, url: str, what: str, *, fs=None, tries: int = RETRIES, sleep=time.sleep):
    """`op()`, retried on transient failures with bounded exponential backoff (with jitter); other failures
    at once, and transient ones after the last try, as a RemoteError naming the URL and the last failure."""
    for attempt in range(tries):
        try:
            return op()
        except Exception as e:   # noqa: BLE001 - classified below
            k = kind(e)
            if k != "transient":
                if isinstance(e, TypeError) and "keyword argument" in str(e):   # a storage option the client lacks
                    raise RemoteError(f"{what} {shown(url)}: the storage options hold one this file system does not "
                                      f"take ({e}): check --storage-option and $FASTFEED_STORAGE_OPTIONS") from None
                if k == "fatal" and not isinstance(e, RemoteError):
                    raise
                raise (e if isinstance(e, RemoteError) else explain(e, url, what, fs)) from None
            if attempt == tries - 1:
                raise RemoteError(f"{what} {shown(url)} failed {tries} times; the last failure: {_describe(e)}. "
                                  "Check the network and the endpoint (AWS_ENDPOINT_URL), then run again") from None
            wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** attempt) * (0.5 + random.random() / 2)
            if attempt == 0:   # said once per operation, when its retries start (loader workers log it too)
                service = "S3" if url.lower().startswith(("s3://", "s3a://")) else bucket_of(url)
                log.warning("%s unreachable (%s %s: %s), retrying for up to %.0f s of backoff (%d more tries, each "
                            "also waiting out its own connection timeout)", service, what, shown(url), _describe(e),
                            backoff_s(tries), tries - 1)
            log.debug("%s %s: %s; retrying in %.1f s", what, shown(url), _describe(e), wait)
            sleep(wait)
    raise AssertionError("unreachable")


# --- whole objects ------------------------------------------------------------------------------------------------

def whole(fs, path: str) -> bytes:
    """An object's bytes in one request: s3fs's `cat_file` without a range asks the object's size first (a HEAD, a
    second round trip before every download's first byte); `bytes=0-` is unsatisfiable only for an empty object."""
    try:
        return fs.cat_file(path, start=0)
    except OSError as e:
        if e.errno == errno.EINVAL and "range" in str(e).lower():
            return b""
        raise


def read_bytes(fs, path: str, url: str, what: str = "reading", *, tries: int = RETRIES) -> bytes:
    return retry(lambda: whole(fs, path), url, what, fs=fs, tries=tries)


def write_bytes(fs, path: str, data: bytes, url: str, what: str = "writing") -> None:
    def put():
        with fs.open(path, "wb") as f:
            f.write(data)
    retry(put, url, what, fs=fs)


def upload(fs, local: Path, path: str, url: str) -> None:
    retry(lambda: fs.put_file(str(local), path), url, "uploading to", fs=fs)


def download(fs, path: str, url: str, fd: int, size: int, *, part: int | None = None, tries: int = RETRIES) -> None:
    """Write object `path` (of `size` bytes) into the open file `fd` at offset 0: in one request when small,
    else in parallel ranged reads of `part` bytes (default PART_BYTES; a store's link sizes them), each retried."""
    part = part or PART_BYTES
    parts = [(a, min(a + part, size)) for a in range(0, size, part)] or [(0, 0)]

    def fetch(span):
        a, b = span

        def get():
            try:
                data = fs.cat_file(path, start=a, end=b) if b > a else whole(fs, path)   # one request each
            except OSError as e:   # a range past the object's end: the object is short
                if e.errno == errno.EINVAL and "range" in str(e).lower():
                    _short(fs, path, url, size)
                raise
            if len(data) != b - a:   # a connection cut short can look like a short body; a short object is not one
                _short(fs, path, url, size)
                raise ConnectionError(f"got {len(data)} of bytes {a}..{b}")
            return data

        os.pwrite(fd, retry(get, url, "downloading", fs=fs, tries=tries), a)

    if len(parts) == 1:   # in this thread: a pool's thread started and joined for each shard costs more than it hides
        return fetch(parts[0])
    with ThreadPoolExecutor(min(PART_THREADS, len(parts)), thread_name_prefix="fastfeed-range") as pool:
        for f in [pool.submit(fetch, s) for s in parts]:
            f.result()


def _short(fs, path: str, url: str, size: int) -> None:
    """RemoteShort when the object is shorter than `size` (asked with a HEAD, on a failed read's path alone)."""
    try:
        have = int(fs.info(path)["size"])
    except Exception:   # noqa: BLE001 - the read's own failure is what gets reported then
        return
    if have < size:
        raise RemoteShort(f"{shown(url)} is {have} bytes, {size} expected", have)


def fetch_many(fs, paths: list[str], url_of: Callable[[str], str], threads: int = 16) -> dict:
    """{path: bytes or the exception} for many small objects, read concurrently (each retried)."""
    def one(p):
        try:
            return p, read_bytes(fs, p, url_of(p))
        except Exception as e:   # noqa: BLE001 - handed back: the caller turns it into a rejection
            return p, e

    if len(paths) <= 1:
        return dict(one(p) for p in paths)
    with ThreadPoolExecutor(min(threads, len(paths)), thread_name_prefix="fastfeed-get") as pool:
        return dict(pool.map(one, paths))
