"""What the loop measures per log interval: loss terms, images/s, and where each loader batch's time
went: waiting for data, the host->device copy the device waited for, compute, DDP communication."""

from __future__ import annotations

import time

import torch

PARTS = ("data", "h2d", "compute", "comm")


class Meter:
    """Loss terms, loader batches, images and the seconds of each part of the step, summed since the last
    reset; accelerator utilisation samples (NVML) where the device reports them."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.items, self.n, self.batches, self.images = torch.zeros(3), 0, 0, 0
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.util: list[float] = []
        self.t = time.perf_counter()

    def add_time(self, **seconds: float) -> None:
        for k, v in seconds.items():
            self.seconds[k] += max(v, 0.0)

    @property
    def busy(self) -> float:
        """Seconds of the step accounted for (data + copy + compute + communication)."""
        return sum(self.seconds.values())

    def row(self) -> dict:
        """Mean loss terms per micro-batch; per loader batch, the ms of each part of the step; images/s
        over the wall time since the reset (evaluation excluded)."""
        terms = (self.items / max(self.n, 1)).tolist()
        per = 1e3 / max(self.batches, 1)
        return {"loss": sum(terms), "box": terms[0], "obj": terms[1], "cls": terms[2],
                "images_per_s": self.images / max(time.perf_counter() - self.t, 1e-9),
                **{f"{k}_ms": v * per for k, v in self.seconds.items()},
                "data_wait_frac": self.seconds["data"] / max(self.busy, 1e-9),
                "util_pct": sum(self.util) / len(self.util) if self.util else None}
