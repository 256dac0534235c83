"""What the loop logs per interval: loss terms, images/s, data-wait vs compute time."""

from __future__ import annotations

import time

import torch


class Meter:
    """Loss terms, images and data-wait / compute seconds summed since the last reset."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.items, self.n, self.images, self.data, self.compute = torch.zeros(3), 0, 0, 0.0, 0.0
        self.t = time.perf_counter()

    def add(self, items: torch.Tensor, images: int, data_s: float, compute_s: float) -> None:
        self.items += items
        self.n += 1
        self.images += images
        self.data += data_s
        self.compute += compute_s

    def row(self) -> dict:
        """Means per micro-batch; images/s over the wall time since the reset (evaluation excluded)."""
        terms = (self.items / max(self.n, 1)).tolist()
        busy = max(self.data + self.compute, 1e-9)
        return {"loss": sum(terms), "box": terms[0], "obj": terms[1], "cls": terms[2],
                "images_per_s": self.images / max(time.perf_counter() - self.t, 1e-9),
                "data_ms": 1e3 * self.data / max(self.n, 1), "compute_ms": 1e3 * self.compute / max(self.n, 1),
                "data_wait_frac": self.data / busy}
