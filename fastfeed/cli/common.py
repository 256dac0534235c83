"""What every subcommand shares: exit codes and the error line."""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import MISSING, fields

from ..preempt import EXIT_PREEMPTED  # noqa: F401  (75: stopped by a signal, checkpoint written: resume)

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


class _LineFormat(logging.Formatter):
    """INFO records are the command's own progress lines, printed as they are; others say what they are."""

    def format(self, record):
        msg = super().format(record)
        return msg if record.levelno == logging.INFO else f"fastfeed: {record.levelname.lower()}: {msg}"


class _Lines(logging.Handler):
    """Each record as a line on stderr, written through tqdm so that it lands above a progress bar on a terminal
    (and as a plain line in a log file, where tqdm draws no bar)."""

    def emit(self, record):
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:   # never let a log line stop the command
            self.handleError(record)


@contextlib.contextmanager
def progress_lines(verbose: bool = False, name: str = "fastfeed"):
    """Show logger `name`'s INFO lines (a long command's progress: `fastfeed train`'s log lines) by default,
    and its DEBUG ones too with `verbose` (`fastfeed -v`). Restored afterwards."""
    logger = logging.getLogger(name)
    old = logger.level, logger.propagate
    handler = _Lines()
    handler.setFormatter(_LineFormat())
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else min(logger.getEffectiveLevel(), logging.INFO))
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old[0])
        logger.propagate = old[1]
