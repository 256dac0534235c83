"""What a bench run measures: `BenchConfig`, checked once, with errors naming the flag and what is valid."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import tasks
from ..checks import check_imgsz, is_int, is_num, need
from ..devices import DEVICES
from ..store.urls import location
from ..tasks import TASKS
from ..train.config import MODELS

BATCH = 16   # the default batch, or the store's size when it holds fewer images (run_bench)

@dataclass
class BenchConfig:
    """A bench run. `workers`: an int, None (LoaderConfig's default) or "auto" (a short sweep).

    The clock runs for `seconds`, or for `batches` timed batches when that is set (it wins).
    The first max(warmup, 1) batches are untimed (the first one's latency is reported apart).
    `step_ms` simulates an accelerator step of that length (the host sleeps, as it would while a
    GPU computes); `model` runs the bundled trainer's step instead. `task`: what the batches carry (None: the
    store's task; "detect": boxes alone, from a store of any task); with `model` always boxes alone (it detects).
    """

    data: Path | str
    loaders: tuple[str, ...] = ("cpu",)
    imgsz: int = 640
    batch_size: int | None = None        # None: BATCH, or the store's size when it holds fewer images
    workers: int | str | None = None
    seconds: float = 10.0
    batches: int | None = None
    warmup: int = 2
    augment: bool = True
    device: str = "cpu"
    step_ms: float | None = None
    model: str | None = None
    seed: int = 0
    progress: bool = True
    store_options: object = None   # StoreOptions for a store at a URL (never in to_dict: credentials)
    sweep_seconds: float | None = None    # per worker count in --workers auto (default: seconds/4, 1..3 s)
    monitor_interval: float = 0.2         # seconds between CPU/memory samples
    task: str | None = None               # LoaderConfig.task: None, the store's; "detect", boxes alone

    def __post_init__(self):
        self.data = location(self.data)   # a folder, or a store's URL
        self.loaders = tuple(self.loaders) if not isinstance(self.loaders, str) else (self.loaders,)

        need(len(self.loaders) > 0, "--loader", "needs at least one loader name (or 'all')", self.loaders)
        check_imgsz(self.imgsz)
        need(self.batch_size is None or (is_int(self.batch_size) and self.batch_size >= 1), "--batch", "must be >= 1",
             self.batch_size)
        need(is_int(self.seed) and self.seed >= 0, "--seed", "must be an integer >= 0", self.seed)
        need(self.workers is None or self.workers == "auto" or (is_int(self.workers) and self.workers >= 0),
             "--workers", "must be an integer >= 0 (0: in the main process) or 'auto'", self.workers)
        need(is_num(self.seconds) and 0 < self.seconds <= 86400, "--seconds", "must be > 0 and at most 86400 (a day)",
             self.seconds)   # inf, 1e300: a run that never ends
        need(self.batches is None or (is_int(self.batches) and self.batches >= 1), "--batches", "must be >= 1",
             self.batches)
        need(is_int(self.warmup) and self.warmup >= 0, "--warmup", "must be >= 0 batches", self.warmup)
        need(isinstance(self.device, str) and re.fullmatch(r"(cpu|cuda|npu)(:\d+)?", self.device) is not None,
             "--device", f"must be one of {', '.join(DEVICES)} (optionally with :index)", self.device)
        need(self.step_ms is None or (is_num(self.step_ms) and 0 <= self.step_ms <= 60000), "--step-ms",
             "must be >= 0 and at most 60000 (a minute)", self.step_ms)
        need(self.model is None or self.model in MODELS, "--model", f"must be one of {', '.join(MODELS)}", self.model)
        need(self.step_ms is None or self.model is None, "--step-ms", "and --model exclude each other",
             (self.step_ms, self.model))
        need(self.task is None or self.task in TASKS, "--task", f"must be one of {', '.join(TASKS)}", self.task)
        need(self.model is None or self.task is None or tasks.get(self.task).field is None, "--task",
             "must be detect with --model (the bundled models detect)", self.task)
        need(self.sweep_seconds is None or (is_num(self.sweep_seconds) and self.sweep_seconds > 0),
             "sweep_seconds", "must be > 0", self.sweep_seconds)
        need(is_num(self.monitor_interval) and self.monitor_interval > 0, "monitor_interval", "must be > 0",
             self.monitor_interval)

    @property
    def batch_task(self) -> str | None:
        """LoaderConfig.task of the loaders measured: boxes alone for the bundled model's step."""
        return "detect" if self.model is not None else self.task

    def resolved_loaders(self) -> list[str]:
        """The loader names in order, 'all' expanded, duplicates dropped; unknown names raise ValueError."""
        from ..loaders import list_loaders

        valid = list_loaders()
        names = [n for name in self.loaders for n in (valid if name == "all" else [name])]
        if unknown := [n for n in names if n not in valid]:
            raise ValueError(f"unknown loader {unknown[0]!r}; valid loaders: {', '.join(valid)} (or 'all')")
        return list(dict.fromkeys(names))

    @property
    def sweep_window(self) -> float:
        return float(self.sweep_seconds) if self.sweep_seconds is not None else min(3.0, max(1.0, self.seconds / 4))

    def to_dict(self) -> dict:
        d = asdict(self) | {"data": str(self.data), "loaders": list(self.loaders)}
        del d["store_options"]
        return d
