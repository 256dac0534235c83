"""What a bench run returns: plain dataclasses, `to_dict()` for JSON. No formatting here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

STAGE_NAMES = ("read", "decode", "augment", "collate", "copy")
SPREAD_MAX = 0.25   # a wider spread (half the interquartile range of the slices, against `overall`): not a steady figure


@dataclass
class Rate:
    """A rate over the timed window. `overall` = everything delivered / the window's length: the headline,
    the figure that ranks loaders. The rest says how steady delivery was: the window cut into `len(slices)`
    equal slices of `slice_s` seconds (about ten, at least five batches each on average), each slice's rate =
    what arrived in it / `slice_s`; their mean is `overall`. A loader that delivers in bursts has slices with
    nothing in them (`empty_slices`) and its slice median can be anything: a spread, never a rate."""

    overall: float
    slice_s: float
    slices: list[float]
    slice_median: float
    slice_p25: float
    slice_p75: float
    slice_min: float
    slice_max: float
    empty_slices: int

    @property
    def spread(self) -> float:
        """Half the slices' interquartile range, relative to `overall` (0.05: about +-5 %)."""
        return (self.slice_p75 - self.slice_p25) / 2 / self.overall if self.overall > 0 else 0.0


def doubt(rate: Rate, batches: int) -> str | None:
    """Why `rate.overall` is not a steady figure (a burst, a wide spread, too few batches), or None."""
    n = len(rate.slices)
    if batches < 5:
        return f"only {batches} timed batch(es): no spread measured; run longer (--seconds or --batches)"
    if rate.empty_slices:
        return (f"bursty delivery: {rate.empty_slices} of {n} equal slices of the {n * rate.slice_s:.1f} s window "
                f"got no batch (the figure is the whole window's; a longer one steadies it)")
    if rate.spread > SPREAD_MAX:
        return (f"spread ±{100 * rate.spread:.0f}%: the rate changed a lot across the window (a busy machine, "
                f"a cache being built); a longer window or a quieter machine steadies it")
    return None


@dataclass
class Stall:
    """Where the consumer's wall time went. stall_fraction = waiting for the next batch / wall.

    With no step (pure throughput) the consumer only waits, so the fraction is near 1 by design;
    it means something in stall mode (`step_ms` or a model), where `steps_per_s` is set against
    `step_only_per_s` (1000 / step_ms: what the accelerator would do with data always ready).
    """

    step_ms: float | None
    stall_fraction: float
    wait_s: float
    copy_s: float
    step_s: float
    steps_per_s: float
    step_only_per_s: float | None
    efficiency: float | None       # steps_per_s / step_only_per_s


@dataclass
class Sweep:
    """`--workers auto`: each candidate's throughput, the pick and why."""

    window_s: float
    points: list[dict]
    chosen: int
    reason: str


@dataclass
class LoaderResult:
    name: str
    status: str = "ok"                      # ok | unavailable (a missing optional dependency) | failed
    error: str | None = None
    workers: int | None = None
    loader_config: dict | None = None
    batches_per_epoch: int | None = None
    order: dict | None = None               # the loader's EpochOrder.describe(): which batch order it follows
    first_batch_s: float | None = None      # create_loader() to the first batch in hand (includes worker start)
    warmup_batches: int = 0
    timed_batches: int = 0
    timed_images: int = 0
    wall_s: float = 0.0
    images_per_s: Rate | None = None
    batches_per_s: Rate | None = None
    # Per-sample milliseconds of each stage, measured inside the workers (wall time in the stage,
    # summed over workers) over the timed window; `copy` is host->device, measured in this process
    # (0.0 on --device cpu, see copy_applicable).
    stage_ms_per_sample: dict[str, float] | None = None
    stage_samples: int = 0
    copy_applicable: bool = False
    stage_sum_ms: float | None = None       # sum of the worker stages per sample (copy excluded)
    worker_busy_fraction: float | None = None   # stage seconds / (max(workers,1) * wall)
    cpu_ms_per_sample: dict[str, float] | None = None   # process CPU (user+sys): workers, main, total
    cpu: dict = field(default_factory=dict)             # machine utilisation over the window, per core and total
    memory: dict = field(default_factory=dict)          # peak sums over main + workers (see monitor.py)
    shared_bytes: int = 0
    stall: Stall | None = None
    sweep: Sweep | None = None
    notes: list[str] = field(default_factory=list)
    unreliable: str | None = None           # why images/s is not a steady figure (result.doubt), None when it is
    ratio: float | None = None              # images/s overall against the first loader that ran
    fastest: bool = False                   # the highest images/s overall

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class BenchResult:
    created: str
    fastfeed_version: str
    machine: dict
    store: dict
    config: dict               # the resolved configuration (loader names expanded, device, step)
    results: list[LoaderResult]
    baseline: str | None = None    # the loader ratios are taken against

    def to_dict(self) -> dict:
        d = asdict(self)
        for r, rd in zip(self.results, d["results"]):
            for key in ("images_per_s", "batches_per_s"):
                if (rate := getattr(r, key)) is not None:
                    rd[key]["spread"] = rate.spread
        d["fastest"] = next((r.name for r in self.results if r.fastest), None)
        return d
