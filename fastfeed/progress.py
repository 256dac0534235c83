"""The one rule for progress bars, every command's (`bar()`): a bar on a terminal only; in a log file its carriage
returns are noise, and the command's INFO log lines (`cli.common.progress_lines`) say the progress instead."""

from __future__ import annotations

from tqdm import tqdm


def bar(*, progress: bool = True, **kw) -> tqdm:
    """A tqdm bar on stderr when `progress` is on and stderr is a terminal, else a silent one (tqdm's
    `disable=None`: off where the stream is not a tty)."""
    return tqdm(disable=None if progress else True, **kw)
