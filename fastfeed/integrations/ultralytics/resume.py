"""What a FastfeedTrainer mid-epoch checkpoint is (docs/design.md, 'Ultralytics through a subclass, never a copy'),
the stop file and the DDP launcher. `epoch` is set to the epoch before the interrupted one (Ultralytics resumes at
the one after; 0 in the first) and `fastfeed` holds the position and the loader's state (`saved_state`). Under DDP
the launching process forwards SIGTERM/SIGUSR1 to the ranks and turns their failure into `Preempted` when a signal
stopped them, into their `DataSourceFailed` when a lost data source did (`STOP_FILE`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import torch

from ...loaders.position import legacy_state
from ...preempt import EXIT_PREEMPTED
from ...train.checkpoint import write_atomically
from ...train.guards import DataSourceFailed
from .exact import STATE_KEY

SAVE_ENV = "FASTFEED_SAVE_EVERY_MIN"
KEY = "fastfeed"                      # the position's entry in a mid-epoch last.pt
STOP_FILE = "fastfeed_stopped.json"   # in save_dir: rank 0 says what stopped the ranks (for the DDP launcher)


class Preempted(SystemExit):
    """A stop signal ended training after an optimizer step; last.pt holds it. Uncaught, the process exits
    with status 75 (EX_TEMPFAIL); `YOLO(last).train(resume=True, trainer=FastfeedTrainer)` continues."""

    def __init__(self, message: str):
        super().__init__(EXIT_PREEMPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


def save_every_min() -> float | None:
    """FASTFEED_SAVE_EVERY_MIN as minutes (None when unset); a ValueError naming it when it is not > 0."""
    raw = os.environ.get(SAVE_ENV, "").strip()
    if not raw:
        return None
    minutes = float("nan")
    with contextlib.suppress(ValueError):
        minutes = float(raw)
    if not minutes > 0:
        raise ValueError(f"{SAVE_ENV}={raw!r}: expected a number of minutes > 0 (e.g. {SAVE_ENV}=10)")
    return minutes


# --- writing: Ultralytics' checkpoint bytes, captured ----------------------------------------------------

class _Capture:
    """Stands in for a Path that `save_model` writes with write_bytes: keeps the bytes instead; anything
    else is the real path's."""

    def __init__(self, path: Path, files: dict):
        self._path, self._files = Path(path), files

    def write_bytes(self, data: bytes) -> int:
        self._files[self._path] = bytes(data)
        return len(data)

    def mkdir(self, *a, **k) -> None:
        self._path.mkdir(*a, **k)

    def __truediv__(self, name) -> _Capture:
        return _Capture(self._path / name, self._files)

    def __fspath__(self) -> str:
        return os.fspath(self._path)

    def __str__(self) -> str:
        return str(self._path)

    def __getattr__(self, name):
        return getattr(self._path, name)


def captured_save(trainer, save) -> tuple[object, dict[Path, bytes]]:
    """Run Ultralytics' `save()` (its save_model) with last, best and the weights folder captured:
    (what it returned, {path: bytes it would have written})."""
    files: dict[Path, bytes] = {}
    real = trainer.last, trainer.best, trainer.wdir
    trainer.last, trainer.best, trainer.wdir = (_Capture(p, files) for p in real)
    try:
        out = save()
    finally:
        trainer.last, trainer.best, trainer.wdir = real
    return out, files


def mid_epoch_checkpoint(trainer, save, position: dict, state: dict | None = None) -> float:
    """last.pt for `position` (`batches` of `epoch` done), in Ultralytics' format, with `state` (exact.py) beside
    it; returns seconds taken."""
    t0 = time.perf_counter()
    epoch = trainer.epoch
    # Ultralytics resumes at the epoch after the checkpoint's, and takes only epoch >= 0 as resumable
    trainer.epoch = max(position["epoch"] - 1, 0)
    period = trainer.save_period
    trainer.save_period = -1                # no epoch<N>.pt for a mid-epoch save
    try:
        _, files = captured_save(trainer, save)
    finally:
        trainer.epoch, trainer.save_period = epoch, period
    ckpt = torch.load(io.BytesIO(files[Path(trainer.last)]), map_location="cpu", weights_only=False)
    ckpt[KEY] = position
    if state is not None:
        ckpt[STATE_KEY] = state
    write_atomically(trainer.last, lambda f: torch.save(ckpt, f))
    return time.perf_counter() - t0


def position_of(ckpt) -> dict | None:
    pos = ckpt.get(KEY) if isinstance(ckpt, dict) else None
    return pos if isinstance(pos, dict) and {"epoch", "batches"} <= set(pos) else None


def saved_state(pos: dict, loader) -> dict:
    """The loader state of a mid-epoch position `pos` (its epoch and batches: a lost source's are the entry's). A
    position written before the loader kept its state is taken as of this run's order with its batch and world size."""
    epoch, batches = int(pos["epoch"]), int(pos["batches"])
    if isinstance(pos.get("loader"), dict):
        return {**pos["loader"], "epoch": epoch, "batches": batches}
    return legacy_state(loader, epoch, batches, batch_size=pos.get("batch_size"), world_size=pos.get("world_size"))


def write_stop_file(save_dir: Path, position: dict) -> None:
    write_atomically(Path(save_dir) / STOP_FILE, lambda f: f.write(json.dumps(position).encode()))


def stopped_since(save_dir: Path, since: float) -> dict | None:
    """What rank 0 wrote in STOP_FILE, if it did after `since` (time.time())."""
    try:
        pos = json.loads((Path(save_dir) / STOP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pos if isinstance(pos, dict) and pos.get("saved_at", 0) >= since else None


# --- the DDP launcher ----------------------------------------------------------------------------------------

class RankForwarder:
    """In the process that launches Ultralytics' DDP ranks (torch.distributed.run in a subprocess): SIGTERM and
    SIGUSR1 go on to the rank processes as SIGTERM (torchrun forwards only what reaches it, and a container
    runtime signals PID 1 alone); the first SIGINT is left to torchrun, which the terminal signalled too."""

    def __init__(self):
        self.signalled: str | None = None
        self.ranks: list = []
        self._previous: dict = {}

    def __enter__(self) -> RankForwarder:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        # torchrun forwards SIGUSR1 (SLURM's --signal=USR1@T) only when told to; otherwise it dies of it
        os.environ.setdefault("PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        first = self.signalled is None
        if signum == signal.SIGINT and not first:
            raise KeyboardInterrupt
        self.signalled = self.signalled or signal.Signals(signum).name
        if signum != signal.SIGINT:
            self.forward()

    def forward(self) -> None:
        import psutil

        me = psutil.Process()
        ranks = [g for child in me.children() for g in child.children()]   # torchrun's children: the ranks
        for p in ranks:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        self.ranks += ranks

    def wait_for_ranks(self, timeout: float = 120.0) -> None:
        """After torchrun ended: let ranks that outlived it (torchrun died of a signal) finish their save."""
        import psutil

        if self.ranks:
            psutil.wait_procs(self.ranks, timeout=timeout)


def launch_ranks(trainer, run) -> object:
    """`run()` (Ultralytics' DDP launch) with signals forwarded; its failure after ranks stopped for a signal
    becomes `Preempted`, after they stopped for a lost data source their `DataSourceFailed`."""
    started = time.time() - 1.0   # the stop file's clock is the ranks' (same host or a shared one)
    with RankForwarder() as fwd:
        try:
            return run()
        except subprocess.CalledProcessError:
            fwd.wait_for_ranks()
            pos = stopped_since(trainer.save_dir, started)
            if pos is None:
                raise
            if pos.get("why") == "data source failed":
                raise DataSourceFailed(pos["message"]) from None
            raise Preempted(describe_stop(pos, trainer.last, type(trainer).__name__)) from None


def describe_stop(pos: dict, last, trainer: str = "FastfeedTrainer") -> str:
    """Epochs counted from 1, as Ultralytics shows them; `trainer`: the class `resume=True` takes again."""
    where = (f"at the end of epoch {pos['epoch']}" if pos["batches"] == 0 else
             f"after {pos['batches']} batches of epoch {pos['epoch'] + 1}")
    return (f"fastfeed: {pos.get('stopped_by')}: stopped {where}; {last} holds it: continue with "
            f"YOLO({str(last)!r}).train(resume=True, trainer={trainer})")
