"""What every subcommand shares: exit codes and the error line."""

from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def fail(message: str, code: int = EXIT_FAIL) -> int:
    print(f"fastfeed: error: {message}", file=sys.stderr)
    return code
