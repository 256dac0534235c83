"""Test-only: FastfeedTrainer under Ultralytics' own DDP launcher, on CPU.

Ultralytics 8.4 has no DDP on CPU: `device="cpu"` gives the trainer world_size 0 (one process), and
its DDP code is CUDA/NPU/XPU only: it picks a GPU per rank, wraps the model with
`device_ids=[device.index]` (which torch rejects for a CPU module), and the final re-validation of
best.pt in each rank asks for the rank's current CUDA device. `CpuDdpTrainer` changes exactly those
four things: world_size 2 on CPU, a gloo process group, no device_ids, and no final re-validation.
Everything else is Ultralytics' DDP path: `generate_ddp_file` cloudpickles the trainer class, args,
model and callbacks; `torch.distributed.run` starts the ranks; each rank rebuilds the trainer from
that file, wraps the model in DistributedDataParallel (gradients all-reduced over gloo), calls
`sampler.set_epoch`, validates its share of the val set every epoch (gathered on rank 0), and rank 0
saves the checkpoints. Each rank writes what its loader read to $FF_DDP_OUT/rank<N>.json (also when a
stop signal ended it: `FF_SIGNAL` sends one, see `signal_at`; or a lost data source: `FF_LOSE`, see `lose_at`), and
rank 0 its final weights to $FF_DDP_OUT/weights.pt.
"""

from __future__ import annotations

import gc
import json
import os
import signal
from datetime import timedelta
from pathlib import Path

import torch
from torch import distributed as dist
from ultralytics.utils import DEFAULT_CFG, LOCAL_RANK, RANK

from fastfeed.integrations.ultralytics import FastfeedTrainer
from fastfeed.store.objstore import RemoteError

WORLD = 2


class _CpuDDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, **kwargs):
        super().__init__(module, device_ids=None if device_ids == [None] else device_ids, **kwargs)


class RecordingTrainer(FastfeedTrainer):
    """FastfeedTrainer keeping [epoch, im_files, images] of every training batch in `_seen` (im_files ["blank"]: a
    blank batch, trained after this rank lost its source), and the size the model gets (after multi_scale) in
    `img_sizes`."""

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        super().__init__(cfg, overrides, _callbacks)
        self._seen = []
        self.img_sizes = []
        self._trained_by = None   # the model's class while it trained (DDP's, let go once the run ends)

    def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
        feed = super().get_dataloader(dataset_path, batch_size, rank, mode)
        if mode == "train":
            lose_at(feed)
        return feed

    def preprocess_batch(self, batch):
        blank = self.train_loader.lost is not None
        self._seen.append([self.epoch, ["blank"] if blank else list(batch["im_file"]), int(len(batch["img"]))])
        self._trained_by = type(self.model).__name__
        signal_at(self)
        out = super().preprocess_batch(batch)
        self.img_sizes.append(int(out["img"].shape[-1]))   # after multi_scale
        return out


class CpuDdpTrainer(RecordingTrainer):
    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        super().__init__(cfg, overrides, _callbacks)
        self.world_size = WORLD
        self.ddp = LOCAL_RANK == -1      # the launching process starts the ranks; a rank trains

    def _setup_ddp(self):
        torch.nn.parallel.DistributedDataParallel = _CpuDDP
        dist.init_process_group("gloo", rank=RANK, world_size=self.world_size, timeout=timedelta(minutes=5))

    def final_eval(self):
        """Skipped: Ultralytics' DDP re-validation of best.pt asks CUDA for each rank's device."""

    def _do_train(self):
        self._error = None
        try:
            super()._do_train()
        except BaseException as e:
            self._error = f"{type(e).__name__}: {e}"
            raise
        finally:
            self._report()

    def _report(self):
        feed = self.train_loader
        lease = getattr(feed.loader, "lease", None)
        report = {"rank": RANK, "loader": feed.name, "loader_rank": feed.rank, "loader_world": feed.world_size,
                  "batch_size": feed.batch_size, "batches": len(feed), "seen": self._seen, "img_sizes": self.img_sizes,
                  "ddp_model": self._trained_by, "cache": str(lease.path) if lease else None,
                  # left for the interpreter's exit: a DDP object (not merely unreachable: no collection ran), the group
                  "ddp_left": any(isinstance(o, torch.nn.parallel.DistributedDataParallel) for o in gc.get_objects()),
                  "group_left": dist.is_initialized(),
                  "built": bool(lease.built) if lease else None,
                  "metrics": {k: float(v) for k, v in (self.metrics or {}).items()}, "error": self._error}
        Path(os.environ["FF_DDP_OUT"], f"rank{RANK}.json").write_text(json.dumps(report))
        if RANK in (-1, 0):
            save_weights(self, Path(os.environ["FF_DDP_OUT"], "weights.pt"))


def save_weights(trainer, path: Path) -> None:
    """The model's and EMA's tensors and the EMA's update count, as training left them."""
    from ultralytics.utils.torch_utils import unwrap_model

    model = {f"model.{k}": v for k, v in unwrap_model(trainer.model).state_dict().items()}
    torch.save(model | {f"ema.{k}": v for k, v in trainer.ema.ema.state_dict().items()}
               | {"updates": torch.tensor(trainer.ema.updates)}, path)


def lose_at(feed) -> None:
    """FF_LOSE="RANK:K": that rank's loader raises the data source's error (a RemoteError, as s3:// reads do once
    their retries give up) in place of the K-th batch of the run (from 1), and on every request after it."""
    spec = os.environ.get("FF_LOSE")
    if not spec:
        return
    rank, at = (int(v) for v in spec.split(":"))
    if RANK not in (rank, -1 if rank == 0 else rank):
        return
    loader, given = feed.loader, [0]
    real = loader.iter_batches

    def batches():
        for batch in real():
            if given[0] + 1 >= at:
                raise RemoteError("s3://bucket/train.ff: unreachable (test)")
            given[0] += 1
            yield batch

    loader.iter_batches = batches


def signal_at(trainer) -> None:
    """FF_SIGNAL="RANK:EPOCH:BATCH": that rank sends itself SIGTERM while it trains that batch (0-based), once."""
    spec = os.environ.get("FF_SIGNAL")
    if not spec:
        return
    rank, epoch, batch = (int(v) for v in spec.split(":"))
    done = sum(1 for e, _, _ in trainer._seen if e == trainer.epoch)
    if RANK in (rank, -1 if rank == 0 else rank) and (trainer.epoch, done - 1) == (epoch, batch):
        os.environ.pop("FF_SIGNAL")
        os.kill(os.getpid(), signal.SIGTERM)
