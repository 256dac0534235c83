"""The `fastfeed` command line: argparse subcommands mapped onto configs.

This package is the only place that prints. One module per subcommand; each has
`add_parser(subparsers)` and `run(args) -> exit code`.
"""

from __future__ import annotations

import argparse
import logging

from .. import __version__
from . import bench, cache, loaders, pack, store, train
from .common import EXIT_USAGE, fail

_COMMANDS = (pack.add_parser, store.add_inspect, store.add_verify, loaders.add_parser, bench.add_parser, cache.add_parser,
             train.add_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastfeed", description="Keep a detection trainer's accelerator fed: pack a dataset, "
                                     "check it, and serve it fast.")
    parser.add_argument("--version", action="version", version=f"fastfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="fastfeed: %(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return fail("interrupted; nothing was left half-written", 130)


__all__ = ["main", "build_parser"]
