"""The device loader's VRAM cache: the same batches, and one that does not fit says what would."""

from __future__ import annotations

import pytest
import torch
from device_helpers import collect, painted, run, same  # noqa: F401  (fixtures)

from fastfeed.loaders import LoaderConfig, create_loader
from fastfeed.loaders.device.vram_cache import VramCacheError

# --- the VRAM cache ---------------------------------------------------------------------------------

def test_the_vram_cache_gives_the_same_batches(painted):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, seed=5)
    want = run(painted, cfg, epochs=(0, 1))
    loader = create_loader("device", painted, cfg, cache="device", cache_reserve_gb=0)
    # every record at its tile size (long side imgsz: 96x72 of 160x120), as the cpu loader takes it
    assert loader.host.ship == "none" and loader.vram_bytes == sum(h * w * 3 for h, w in
                                                                       [painted.record(i).tile_size(96) for i in range(24)])
    assert loader.vram_bytes == 24 * 96 * 72 * 3
    assert same([b for e in (0, 1) for b in collect(loader, e)], want)
    loader.close()
    with pytest.raises(RuntimeError, match="closed, which freed its VRAM cache; create a new loader"):
        iter(loader)


def test_a_vram_cache_that_does_not_fit_says_what_would(painted, monkeypatch):
    import fastfeed.loaders.device.vram_cache as cache_mod

    need = sum(h * w * 3 for h, w in [painted.record(i).size for i in range(24)])
    work = cache_mod.working_bytes(4, 160, torch.device("cpu"))
    monkeypatch.setattr(cache_mod, "free_memory", lambda device: (need // 2 + work, 10 * 2**30))
    with pytest.raises(VramCacheError, match=r"cache='device' needs 0\.0 GiB for 24 images at imgsz 160, plus .* "
                                               r"cpu has \d+\.\d GiB free of 10\.0 GiB\. At imgsz \d+ it would need about"):
        create_loader("device", painted, LoaderConfig(imgsz=160, batch_size=4), cache="device", cache_reserve_gb=0)
