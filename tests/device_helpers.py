"""What the device-loader tests share: the painted store, collecting batches as uint8 (one torch thread: conftest)."""

from __future__ import annotations

import pytest
import torch
from loader_checks import (
    make_painted_store,
)

from fastfeed.loaders import create_loader


@pytest.fixture(scope="module")
def painted(tmp_path_factory):
    """24 raw images (exact pixels) of grey noise, each with one red rectangle and its box."""
    return make_painted_store(tmp_path_factory.mktemp("painted"))


def u8(images: torch.Tensor) -> torch.Tensor:
    """The device loader's float images in [0,1] as the uint8 the shared checks read."""
    return (images.float() * 255).round_().to(torch.uint8)


def collect(loader, epoch=0, start=0):
    loader.set_epoch(epoch, start)
    return [(u8(b.images), b.targets.clone()) for b in loader]


def run(store, cfg, epochs=(0,), **options):
    with create_loader("device", store, cfg, **options) as loader:
        return [b for e in epochs for b in collect(loader, e)]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


class LoggedHost:
    """The host loader, logging each request for a host batch before making it (its slot is reused then)."""

    def __init__(self, host, log):
        self.host, self.log = host, log

    def __len__(self):
        return len(self.host)

    def set_epoch(self, epoch):
        self.host.set_epoch(epoch)

    def __iter__(self):
        it, k = iter(self.host), 0
        try:
            while True:
                self.log.append(("request", k))
                try:
                    b = next(it)
                except StopIteration:
                    return
                yield b
                k += 1
        finally:
            it.close()
