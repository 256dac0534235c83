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
saves the checkpoints. Each rank writes what its loader read to $FF_DDP_OUT/rank<N>.json.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
from torch import distributed as dist
from ultralytics.utils import DEFAULT_CFG, LOCAL_RANK, RANK

from fastfeed.integrations.ultralytics import FastfeedTrainer

WORLD = 2


class _CpuDDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, **kwargs):
        super().__init__(module, device_ids=None if device_ids == [None] else device_ids, **kwargs)


class CpuDdpTrainer(FastfeedTrainer):
    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        super().__init__(cfg, overrides, _callbacks)
        self.world_size = WORLD
        self.ddp = LOCAL_RANK == -1      # the launching process starts the ranks; a rank trains
        self._seen = []

    def _setup_ddp(self):
        torch.nn.parallel.DistributedDataParallel = _CpuDDP
        dist.init_process_group("gloo", rank=RANK, world_size=self.world_size, timeout=timedelta(minutes=5))

    def final_eval(self):
        """Skipped: Ultralytics' DDP re-validation of best.pt asks CUDA for each rank's device."""

    def preprocess_batch(self, batch):
        self._seen.append([self.epoch, list(batch["im_file"]), int(len(batch["img"]))])
        return super().preprocess_batch(batch)

    def _do_train(self):
        super()._do_train()
        feed = self.train_loader
        lease = getattr(feed.loader, "cache", None)
        report = {"rank": RANK, "loader": feed.name, "loader_rank": feed.rank, "loader_world": feed.world_size,
                  "batch_size": feed.batch_size, "batches": len(feed), "seen": self._seen,
                  "ddp_model": type(self.model).__name__, "cache": str(lease.path) if lease else None,
                  "built": bool(lease.built) if lease else None,
                  "metrics": {k: float(v) for k, v in (self.metrics or {}).items()}}
        Path(os.environ["FF_DDP_OUT"], f"rank{RANK}.json").write_text(json.dumps(report))
