"""The `fastfeed` command line: argparse subcommands mapped onto configs.

This package is the only place that prints. One module per subcommand; each has
`add_parser(subparsers)` and `run(args) -> exit code`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .. import __version__
from . import bench, cache, loaders, pack, store, train
from .common import EXIT_USAGE, Lines, exact, fail

# name -> (one-line help, the function that adds its full parser). A command's full parser (which may
# import its configs, and with them torch) is built only when that command runs, so `fastfeed --help`
# and the light commands start in a fraction of a second.
_COMMANDS = {
    "pack": (pack.HELP, pack.add_parser), "inspect": (store.INSPECT_HELP, store.add_inspect),
    "verify": (store.VERIFY_HELP, store.add_verify), "loaders": (loaders.HELP, loaders.add_parser),
    "bench": (bench.HELP, bench.add_parser), "cache": (cache.HELP, cache.add_parser),
    "train": (train.HELP, train.add_parser),
}


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The parser; `argv` says which command to build in full (all of them when None)."""
    parser = exact(
        prog="fastfeed", description="Keep a detection trainer's accelerator fed: pack a dataset, "
                                     "check it, and serve it fast.")
    parser.add_argument("--version", action="version", version=f"fastfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=exact)
    wanted = next((arg for arg in argv or () if not arg.startswith("-")), None)   # the command named first
    for name, (summary, add) in _COMMANDS.items():
        if argv is None or name == wanted:
            add(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[Lines()],
                        format="%(message)s")   # `fastfeed: warning: ...` from every command
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return fail("interrupted; nothing was left half-written", 130)
    except BrokenPipeError:   # what reads the output went away (`fastfeed inspect S | head`): stop, as a filter does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the exit's last flush writes nowhere
        return 128 + 13   # as a process that SIGPIPE ended


__all__ = ["main", "build_parser"]
