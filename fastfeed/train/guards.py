"""What keeps a run from losing work or surprising its user: an --out that already holds a run (refused
without --resume or --force), its cost (on a CPU measured before the first step, elsewhere after it: a step, an
epoch, the run, with what to change on a CPU when the run would take hours), and a data source that fails for good mid-epoch (last.pt first, then a named error).
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from pathlib import Path

import torch

from ..store.objstore import RemoteError
from . import distributed
from .device import TrainError
from .verdict import smaller_settings

log = logging.getLogger(__name__)

RUN_FILES = ("last.pt", "metrics.jsonl")   # what makes a folder a run's
HOURS_HINT_S = 3600.0                      # a CPU run estimated longer than this gets the smaller settings named


class RunExists(TrainError):
    """--out already holds a run and neither --resume nor --force was given."""


class DataSourceFailed(RemoteError):
    """The training store became unreadable for good mid-run (object storage out after its retries); last.pt
    holds the last finished step and --resume continues from it."""


class LoaderFailed(TrainError):
    """A loader worker died, stalled or raised mid-epoch (not the data source); last.pt holds the last finished step
    and --resume continues from it."""


class RankSourceFailed(Exception):
    """Under DDP: some rank's data source failed for good, learnt by every rank at the same micro-batch through the
    loss all-reduce (docs/design.md, 'Under DDP the ranks stop together'); `loop.lost_source` saves and names it."""


# --- an --out that holds a run ---------------------------------------------------------------------------------

def check_out(run) -> None:
    """A new run (no --resume) in a folder that holds one would append to its metrics.jsonl and replace its
    last.pt: refused unless --force, which starts metrics.jsonl (and best.pt) anew once set-up has succeeded."""
    cfg, out = run.cfg, run.out
    if cfg.resume or cfg.eval_only:
        return
    found = [n for n in RUN_FILES if (out / n).is_file()] if run.dd.main else []
    if distributed.any_true(bool(found), run.dd, run.device) and not cfg.force:   # any_true first: every rank joins it
        raise RunExists(f"--out {out} already holds a run ({', '.join(found) or 'on rank 0'}): continue it with "
                        "--resume, start a new run there with --force (replacing its last.pt, best.pt and "
                        "metrics.jsonl), or give another --out")


def replace_old(run) -> None:
    """--force over a run in --out: its metrics.jsonl and best.pt removed (last.pt is replaced at the first checkpoint),
    said once; called when the new run is set up (a command refused before changes nothing)."""
    out, held = run.out, [n for n in RUN_FILES if (run.out / n).is_file()]
    if not (run.cfg.force and not run.cfg.resume and run.dd.main and held):
        return
    gone = [n for n in ("metrics.jsonl", "best.pt") if (out / n).is_file()]
    for n in gone:
        (out / n).unlink()
    log.warning("--force: starting a new run in %s: %s%s", out, f"removed its {' and '.join(gone)}; " if gone else "",
                "its last.pt is replaced at the first checkpoint" if "last.pt" in held else "nothing else there is touched")


# --- the measured pace ------------------------------------------------------------------------------------------

def _duration(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 48 * 3600 else f"{s / 86400:.1f} days"


def pace(run, step_s: float, how: str, tips: bool = True) -> bool:
    """What a step (`step_s`: `how` says where the figure comes from), an epoch and the steps left take; with
    `tips`, on a CPU, when that is hours, the smaller settings that would shorten it (returns whether it named
    them)."""
    cfg = run.cfg
    end = min(run.total_steps, cfg.max_steps) if cfg.max_steps is not None else run.total_steps
    left = max(end - run.step, 0)
    epoch_s, run_s = step_s * run.steps_per_epoch, step_s * left
    run.report.record({"event": "pace", "how": how, "step": run.step, "step_s": step_s, "epoch_s": epoch_s,
                       "run_s": run_s, "steps_left": left})
    if not run.dd.main:
        return False
    log.info("%s %s; at that pace an epoch (%d steps) takes ~%s and the %d steps left ~%s", how,
             _duration(step_s) if step_s >= 1 else f"{step_s:.2f} s", run.steps_per_epoch, _duration(epoch_s), left,
             _duration(run_s))
    if not (tips and run.device.type == "cpu" and run_s >= HOURS_HINT_S):
        return False
    smaller = smaller_settings(cfg.model, cfg.imgsz) + [f"fewer --epochs (now {cfg.epochs}) or --max-steps N"]
    log.warning("on a CPU this run takes ~%s; to finish sooner: %s, or an accelerator (--device cuda or npu)",
                _duration(run_s), ", ".join(smaller))
    return True


def image_seconds(run) -> float:
    """One image's forward and backward at --imgsz, measured (gradients and BatchNorm statistics put back). A
    first pass under a second is mostly the first call's set-up: it is measured again."""
    x = torch.full((1, 3, run.cfg.imgsz, run.cfg.imgsz), 0.5, device=run.device)   # no draw from the RNG
    run.raw_model.train()
    run.snapshot.take()   # the statistics as they are now (a resumed run's, not those set_up saw)
    took = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        run.loss_fn(run.raw_model(x), torch.zeros((0, 6), device=run.device))[0].backward()
        took = time.perf_counter() - t0
        if took >= 1.0:
            break
    run.optimizer.zero_grad(set_to_none=True)
    run.snapshot.restore()
    return took


def estimate(run, seconds=None) -> bool:
    """Before the first step (on a CPU: 64 images at 640 take minutes): `seconds(run)` (`image_seconds`) scaled to a
    step's images on this process, told as `pace` tells it (returns whether it named smaller settings)."""
    per_image = (seconds or image_seconds)(run)
    images = run.images_per_step // run.dd.world_size
    return pace(run, per_image * images, f"cost, before the first step: one image's forward and backward took "
                                  f"{per_image:.2f} s here, so a step of {images} images takes about")


# --- a data source that fails for good -------------------------------------------------------------------------

_LAST_LINE = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*): (?P<msg>.*)$")


def source_failure(e: BaseException) -> str | None:
    """The one-line message when `e` is the data source failing for good: a RemoteError raised in this process,
    or one a loader worker raised (it arrives as a WorkerError carrying the worker's traceback, whose last line
    names the exception's class). None for anything else."""
    if isinstance(e, RemoteError):
        return str(e)
    from ..loaders.workers import WorkerError

    if not isinstance(e, WorkerError):
        return None
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    m = _LAST_LINE.match(lines[-1].strip()) if lines else None
    if m is None or "." not in m["cls"]:
        return None
    module, _, name = m["cls"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return m["msg"] if isinstance(cls, type) and issubclass(cls, RemoteError) else None


def ranks_lost(message: str | None, d: distributed.Dist) -> str:
    """Every rank, where they all learnt that some rank's source failed (`message`: this rank's `source_failure`, or
    None): which ranks' failed and why, the same line on every rank (one all_gather_object)."""
    got = distributed.gather(message, d)
    return "; ".join(f"rank {r}: {m}" for r, m in enumerate(got) if m) + " (the other ranks stopped at the same step)"


def resume_hint(last: Path) -> str:
    return f"{last} holds the last finished step: continue with the same command and --resume once it is reachable"
