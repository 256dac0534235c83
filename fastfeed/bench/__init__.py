"""`fastfeed bench`: loaders side by side in one process — throughput, stage times, stalls, CPU, memory.

    from fastfeed.bench import BenchConfig, run_bench, format_table
    result = run_bench(BenchConfig(data="coco.ff", loaders=("cpu", "shm"), seconds=10))
    text = format_table(result)          # the terminal table (the CLI prints it)
    result.to_dict()                      # every figure, the machine and the resolved configuration

Nothing here prints: results are dataclasses, progress goes to a bar on a terminal (`fastfeed.progress`) and to
INFO log lines (plain lines in a log file), notes to logging.
"""

from .config import BenchConfig
from .report import format_table, write_plot  # matplotlib only once write_plot is called (the `plot` extra)
from .result import BenchResult, LoaderResult
from .run import run_bench

__all__ = ["BenchConfig", "BenchResult", "LoaderResult", "format_table", "run_bench", "write_plot"]
