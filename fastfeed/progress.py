"""The one rule for progress bars: a bar on a terminal only.

A bar redraws itself with carriage returns; in a log file (`fastfeed train ... > log 2>&1`, `make demo > log`)
those are noise. Where stderr is not a terminal there is no bar, and the command's INFO log lines
(`cli.common.progress_lines`) say the progress as plain lines instead. Every bar a command shows while it
works (train, bench) comes from `bar()`.
"""

from __future__ import annotations

from tqdm import tqdm


def bar(*, progress: bool = True, **kw) -> tqdm:
    """A tqdm bar on stderr when `progress` is on and stderr is a terminal, else a silent one (tqdm's
    `disable=None`: off where the stream is not a tty)."""
    return tqdm(disable=None if progress else True, **kw)
