"""What every subcommand shares: exit codes and the error line."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sys
from dataclasses import MISSING, fields

from ..preempt import EXIT_PREEMPTED  # noqa: F401  (75: stopped by a signal, checkpoint written: resume)

# Every parser, the subcommands' too (add_subparsers(parser_class=exact)): a flag only as spelled (`--epoch 1` is
# no `--epochs`, `--shard` no `--shards`).
exact = functools.partial(argparse.ArgumentParser, allow_abbrev=False)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def fail(message: str | Exception, code: int = EXIT_FAIL) -> int:
    """Say `message` (an error: its message) on one line; returns `code`. A folder the store said is no store is
    named as the dataset `fastfeed pack` reads in it, if it is one (pack/layout: the store knows no datasets)."""
    from ..store.format import NotAStore

    if isinstance(message, NotAStore) and message.path.is_dir():
        message = _dataset_instead(message.path) or message
    print(f"fastfeed: error: {message}", file=sys.stderr)
    return code


def _dataset_instead(path) -> str | None:
    from ..pack.layout import TwoLayouts, detect_format

    pack = f"`fastfeed pack {path} -o {path.resolve().name or 'data'}.ff"
    try:
        what = f"a {detect_format(path).upper()} dataset, not a fastfeed store: pack it with {pack}`"
    except TwoLayouts:
        what = (f"a dataset folder with both a COCO JSON and YOLO labels, not a fastfeed store: pack it with {pack} "
                "--format coco` (or `--format yolo`)")
    except Exception:   # noqa: BLE001 - not a layout pack knows (or an unreadable folder): no dataset either
        return None
    return f"{path} is {what}, then pass the .ff folder"


def int_or_auto(expected: str, minimum: int | None = None, auto: bool = True):
    """An argparse type: 'auto' (unless not `auto`), or an integer (at least `minimum`); anything else is refused as not
    `expected`."""
    def parse(value: str):
        if auto and value == "auto":
            return value
        with contextlib.suppress(ValueError):
            if minimum is None or int(value) >= minimum:
                return int(value)
        raise argparse.ArgumentTypeError(f"expected {expected}" + " or 'auto'" * auto + f", got {value!r}")

    return parse


def defaults(cls) -> dict:
    """The defaults of dataclass `cls`'s fields by name, so a flag's default is written once, in the config."""
    return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING}


def config_of(cls, args, **fixed):
    """Config class `cls` from the flags named as its fields (one not given, None, keeps the field's default),
    with `fixed` for the fields whose flag is named or shaped otherwise."""
    return cls(**{f.name: v for f in fields(cls) if (v := getattr(args, f.name, None)) is not None} | fixed)


class Lines(logging.Handler):
    """Each record as a line on stderr, written through tqdm so that it lands above a progress bar on a terminal
    (and as a plain line in a log file, where tqdm draws no bar). INFO records are the command's own progress
    lines, printed as they are; others say what they are (`fastfeed: warning: ...`, every command's)."""

    def emit(self, record):
        try:
            from tqdm import tqdm

            msg = self.format(record)
            if record.levelno != logging.INFO:
                msg = f"fastfeed: {record.levelname.lower()}: {msg}"
            tqdm.write(msg, file=sys.stderr)
        except Exception:   # never let a log line stop the command
            self.handleError(record)


@contextlib.contextmanager
def progress_lines(verbose: bool = False, name: str = "fastfeed"):
    """Show logger `name`'s INFO lines (a long command's progress: `fastfeed train`'s log lines) by default,
    and its DEBUG ones too with `verbose` (`fastfeed -v`). Restored afterwards."""
    logger = logging.getLogger(name)
    old = logger.level, logger.propagate
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else min(logger.getEffectiveLevel(), logging.INFO))
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old[0])
        logger.propagate = old[1]


def store_path(text: str):
    """argparse type of a store or dataset location: a URL stays a string (`Path` would eat a slash)."""
    from ..store.urls import location

    return location(text)


def add_remote_args(p) -> None:
    """Flags for stores and datasets in object storage (s3://, gs://, az://, any fsspec URL)."""
    from ..store.objstore import BACKOFF_S, RETRIES, backoff_s
    from ..store.remote.shards import DEFAULT_READ_AHEAD, READ_AHEAD_BYTES, READ_AHEAD_SHARE

    g = p.add_argument_group("object storage (a URL instead of a folder)")
    g.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec storage option, repeatable (VALUE as JSON when it parses: anon=true, "
                        "client_kwargs='{\"endpoint_url\": \"http://minio:9000\"}'); credentials and endpoints also come "
                        "the standard ways: AWS_* / AWS_ENDPOINT_URL, profiles, $FASTFEED_STORAGE_OPTIONS (JSON); "
                        "default: none")
    g.add_argument("--shard-cache", metavar="DIR",
                   help="node-local folder the shards are downloaded into, shared by every process on the node "
                        "(default $FASTFEED_SHARD_CACHE, else ~/.cache/fastfeed/shards): a local disk")
    g.add_argument("--shard-cache-limit", metavar="SIZE",
                   help="most the shard cache may hold: 50G, 500M, 40%% of its disk (default "
                        "$FASTFEED_SHARD_CACHE_LIMIT, else 80%% of what the disk can give)")
    g.add_argument("--read-ahead-shards", metavar="N", type=int,
                   help="the shard read-ahead: most shards downloaded ahead of the ones being read (default "
                        f"$FASTFEED_READ_AHEAD_SHARDS, else {READ_AHEAD_BYTES >> 20} MB of shards: at least "
                        f"{DEFAULT_READ_AHEAD}, at most {READ_AHEAD_SHARE * 100:.0f}%% of what the shard cache holds); the "
                        "downloads in flight follow the link")
    g.add_argument("--store-retries", metavar="N", type=int, help=f"tries of one read from object storage (default "
                   f"{RETRIES}: {backoff_s(RETRIES):.0f} s of backoff; 20: {backoff_s(20):.0f} s). Each retry waits up to "
                   f"{BACKOFF_S[1]:.0f} s plus its connection timeout, and a loader worker with no batch for 300 s (the "
                   "loaders' timeout) counts as hung: keep the retries well under it")


def store_options(args):
    """The object-storage flags over the `FASTFEED_*` variables (read here, once: `StoreOptions.from_env`) as the
    `StoreOptions` every Store of this command is opened with (they travel into its workers with the Store; the
    environment is left as it was). ValueError for a bad flag or variable."""
    from ..store.objstore import parse_option
    from ..store.options import StoreOptions
    from ..store.remote.sizes import default_dir, parse_size

    opts = dict(parse_option(o) for o in getattr(args, "storage_option", None) or [])
    options = StoreOptions.from_env(os.environ, shard_cache=getattr(args, "shard_cache", None) or None,
                                    shard_cache_limit=getattr(args, "shard_cache_limit", None) or None,
                                    storage_options=opts, read_ahead=getattr(args, "read_ahead_shards", None),
                                    retries=getattr(args, "store_retries", None))
    if options.shard_cache_limit is not None:
        parse_size(options.shard_cache_limit, options.shard_cache or default_dir())   # refused here, not in a worker
    return options
