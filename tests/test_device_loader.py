"""The `device` loader on CPU torch (the path every machine has): the Batch contract, boxes on their
painted objects, the cpu loader's draws for the same seed, ranks, resuming, failures, the VRAM tier,
the decoders, the side-stream protocol against a fake CUDA module, the trainer's and the bench's use,
and the augmentation statistics against the cpu loader's."""

from __future__ import annotations

import shutil
import types

import numpy as np
import pytest
import torch
from conftest import CocoBuilder, jpeg_bytes
from loader_checks import (
    assert_a_killed_worker_raises,
    assert_batch_contract,
    assert_boxes_frame_paint,
    make_painted_store,
)
from loader_checks import painted as _painted
from test_pack import run_pack

from fastfeed import Store
from fastfeed.augment import AugmentHyp
from fastfeed.loaders import LoaderConfig, WorkerError, create_loader, list_loaders, loader_options
from fastfeed.loaders.device.cache import DeviceCacheError
from fastfeed.loaders.device.decode import make_decoder
from fastfeed.loaders.sampler import epoch_batches

NO_COLOUR = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The CPU stands in for the device here: one intra-op thread, which on a small shared machine is
    several times faster than two waiting for each other (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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


# --- the contract ----------------------------------------------------------------------------------

def test_registered_with_its_options_and_checks_them():
    assert "device" in list_loaders()
    from fastfeed.loaders import loader_info

    info = {i.name: i for i in loader_info()}["device"]
    assert info.available and info.options == {"partner_buffer": None, "cache": None, "dtype": "float32",
                                               "decoder": "auto", "cache_reserve_gb": 8.0}
    assert loader_options("device", dtype=torch.bfloat16).dtype == "bfloat16"
    for bad, match in (({"cache": "ram"}, "device option cache must be None or 'device'"),
                       ({"dtype": "uint8"}, "device option dtype must be one of float32"),
                       ({"decoder": "pillow"}, "device option decoder must be one of auto, torchvision"),
                       ({"cache_reserve_gb": -1}, "cache_reserve_gb must be a number of GiB >= 0"),
                       ({"partner_buffer": 2}, "partner_buffer must be an integer >= 4")):
        with pytest.raises(ValueError, match=match):
            loader_options("device", **bad)


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_contract_on_the_device(painted, workers):
    cfg = LoaderConfig(imgsz=96, batch_size=5, workers=workers, drop_last=False)
    with create_loader("device", painted, cfg, dtype="bfloat16") as loader:
        assert loader.on_device and loader.device == torch.device("cpu")   # auto: no GPU/NPU here
        loader.set_epoch(0)
        batches = list(loader)
        assert len(batches) == len(loader) == 5
        for images, _ in batches:
            assert images.dtype == torch.bfloat16 and images.device.type == "cpu"
            assert float(images.min()) >= 0 and float(images.max()) <= 1
    assert_batch_contract([(u8(i), t) for i, t in batches], 96, nc=3, total=24)


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=0, mosaic=0.0),
                                 AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=1.0, flipud=0.5)])
def test_boxes_frame_the_painted_objects_after_augmentation(painted, hyp):
    """The cpu loader's check (tests/test_loaders.py), on the device loader's batches."""
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=3)
    assert_boxes_frame_paint(run(painted, cfg, epochs=(0, 1)), 128)


def test_eval_batches_are_the_cpu_loaders_letterbox(painted):
    """Letterboxed evaluation batches: the cpu loader's targets exactly, its pixels within one level
    (bilinear in float here, OpenCV's fixed point there; a copy at scale 1)."""
    for size, tol in ((160, 0), (128, 1)):
        cfg = LoaderConfig(imgsz=size, batch_size=8, workers=0, augment=False, shuffle=False, drop_last=False)
        dev = run(painted, cfg)
        with create_loader("cpu", painted, cfg) as loader:
            loader.set_epoch(0)
            cpu = [(b.images.clone(), b.targets.clone()) for b in loader]
        for (a, ta), (b, tb) in zip(dev, cpu):
            assert (a.int() - b.int()).abs().max() <= tol
            assert torch.equal(ta, tb)


def test_same_seed_same_batches_other_seed_other_batches(painted):
    def go(seed):
        return run(painted, LoaderConfig(imgsz=96, batch_size=4, workers=2, seed=seed), epochs=(0, 1))

    a, b, c = go(1), go(1), go(2)
    assert same(a, b)
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c))


def _matched(a: torch.Tensor, b: torch.Tensor, tol: float) -> int:
    """Rows of targets `a` with a row of `b` of the same image and class within `tol` on every coordinate."""
    if not len(a) or not len(b):
        return 0
    near = (a[:, None, 2:] - b[None, :, 2:]).abs().amax(-1) <= tol
    same_ids = (a[:, None, :2] == b[None, :, :2]).all(-1)
    return int((near & same_ids).any(1).sum())


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=20, shear=5, flipud=0.5)])
def test_the_cpu_loaders_draws_for_the_same_seed(painted, hyp):
    """Same seed, workers and partner buffer: the same mosaics, partners, centres, affines and flips as the cpu
    loader. Boxes agree within a pixel: the cpu loader snaps each tile's source crop to whole pixels, this one
    samples the exact map, so a box on the edge of the filter's thresholds may go one way here, the other
    there (a few in a hundred). Where both warp (rotation: the cpu loader's exact path) the pixels agree too."""
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=7)
    dev = run(painted, cfg, epochs=(0, 1), partner_buffer=8)
    cpu = []
    with create_loader("cpu", painted, cfg, partner_buffer=8) as loader:
        for e in (0, 1):
            loader.set_epoch(e)
            cpu += [(b.images.clone(), b.targets.clone()) for b in loader]
    assert len(dev) == len(cpu) == 6
    n_dev, n_cpu = sum(len(t) for _, t in dev), sum(len(t) for _, t in cpu)
    both = sum(_matched(ta, tb, 1.5 / 128) for (_, ta), (_, tb) in zip(dev, cpu))
    assert n_dev > 50 and both >= 0.96 * max(n_dev, n_cpu)
    if not hyp.axis_aligned:
        assert all((a.float() - b.float()).abs().mean() < 1.0 for (a, _), (b, _) in zip(dev, cpu))


def test_ranks_cover_the_epoch_once(painted):
    """Two ranks' letterboxed batches (each image identified by its one box): disjoint, all 24 images."""
    def boxes_of(rank):
        cfg = LoaderConfig(imgsz=160, batch_size=4, workers=0, augment=False, rank=rank, world_size=2, drop_last=False)
        return [tuple(np.round(t[1:].numpy(), 4)) for _, targets in run(painted, cfg) for t in targets]

    r0, r1 = boxes_of(0), boxes_of(1)
    assert len(r0) == len(set(r0)) == len(r1) == 12 and not set(r0) & set(r1) and len(set(r0) | set(r1)) == 24


def test_close_mosaic_turns_mosaic_off_for_the_last_epochs(painted):
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=0, epochs=3, close_mosaic=1, hyp=NO_COLOUR)
    with create_loader("device", painted, cfg) as loader:
        def most_boxes(epoch):
            return max(np.bincount(t[:, 0].long().numpy()).max() for _, t in collect(loader, epoch))
        assert most_boxes(0) > 1 and most_boxes(2) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_started_anywhere_gives_the_uninterrupted_batches(painted, workers):
    """set_epoch(e, start): the batches of an uninterrupted run, without building the skipped ones; partners
    from the replayed buffers that the device never saw are read and decoded in this process."""
    cfg = LoaderConfig(imgsz=96, batch_size=2, workers=workers, hyp=NO_COLOUR, seed=4)
    with create_loader("device", painted, cfg, partner_buffer=6) as loader:
        full = [collect(loader, e) for e in range(2)]
    n = len(full[0])
    for epoch, start in ((1, 5), (0, n - 1)):
        with create_loader("device", painted, cfg, partner_buffer=6) as loader:
            got = collect(loader, epoch, start)
            assert same(got, full[epoch][start:]), f"epoch {epoch} from batch {start}"
            assert loader.stage_times().samples <= 2 * (n - start) + 2 * workers * cfg.prefetch
            assert loader.feed.reread > 0
    with create_loader("device", painted, cfg, partner_buffer=6) as loader:
        loader.set_epoch(0)
        for k, _ in enumerate(loader):          # abandoned half-way
            if k == 4:
                break
        assert same(collect(loader, 1), full[1])


def test_decoded_images_are_kept_only_while_a_partner_buffer_lists_them(painted):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, hyp=NO_COLOUR)
    with create_loader("device", painted, cfg, partner_buffer=4) as loader:
        collect(loader, 0)
        assert loader.feed.reread == 0 and loader.feed.decoded == 24          # each record decoded once
        assert 0 < len(loader.feed.images) <= 2 * 4                            # 2 workers x 4 buffered
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, augment=False)
    with create_loader("device", painted, cfg) as loader:
        collect(loader, 0)
        assert not loader.feed.images                                          # no partners: nothing kept


# --- failures --------------------------------------------------------------------------------------

def test_a_corrupt_record_raises_worker_error_naming_it(painted, tmp_path):
    from test_store import _flip_byte_in_record

    bad = tmp_path / "bad.ff"
    shutil.copytree(painted.path, bad)
    _flip_byte_in_record(bad, 5)
    with create_loader("device", Store(bad), LoaderConfig(imgsz=64, batch_size=4, workers=2, shuffle=False)) as ld:
        ld.set_epoch(0)
        with pytest.raises(WorkerError, match="record 5 in shard shard-00000.mdb: CRC32 mismatch"):
            list(ld)


def test_a_killed_worker_raises_instead_of_hanging(painted):
    assert_a_killed_worker_raises(create_loader("device", painted, LoaderConfig(imgsz=64, batch_size=2, workers=2, timeout=30)))


def test_decoders_that_cannot_run_here_are_errors_not_fallbacks():
    cpu = torch.device("cpu")
    assert make_decoder("auto", cpu).name == "host"
    npu = types.SimpleNamespace(type="npu", index=0)   # torch.device("npu") needs torch_npu; only .type is read
    assert make_decoder("auto", npu).name == "host"
    for name in ("torchvision", "nvimgcodec"):
        with pytest.raises(ValueError, match=f"decoder='{name}' decodes on NVIDIA GPUs .* use decoder='host'"):
            make_decoder(name, npu)
    try:
        import torchvision.io  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed here, or built for another torch
        with pytest.raises(ImportError, match="decoder='torchvision' needs torchvision, which does not import"):
            make_decoder("torchvision", types.SimpleNamespace(type="cuda", index=0))


class StoredFrameDecoder:
    """A stand-in for nvJPEG: decodes JPEG bytes on the CPU in the *stored* frame (no EXIF turn, full size),
    so the device path's orientation, fit and slot handling run here."""

    name, on_host = "stored-frame", False

    def decode(self, jpegs, stream=None):
        import simplejpeg

        from fastfeed.loaders.device.decode import orient

        return [orient(torch.from_numpy(simplejpeg.decode_jpeg(t.numpy().tobytes())), o) for t, o in jpegs]


def test_the_device_decode_path_turns_by_exif_and_fits_to_the_cpu_loaders_size(tmp_path, monkeypatch):
    """JPEG bytes shipped to a (stand-in) device decoder: records with EXIF orientations 1, 6, 3, 8 come out
    as the host decode gives them: the same letterboxed pixels (scale 1) and boxes; larger than imgsz, fitted
    to the size the cpu loader decodes at (the boxes still exactly the same)."""
    from test_store import _replace_record

    b = CocoBuilder(tmp_path / "src")
    for k in range(8):
        img, box = _painted(k, 96, 128)
        b.add_image(f"{k}.jpg", 96, 128, data=jpeg_bytes(img, 95), boxes=[(1, box)])
    run_pack(b.write(), tmp_path / "s.ff")
    with Store(tmp_path / "s.ff") as s:
        sizes = [s.record(k).size for k in range(8)]
    for k, o in ((1, 6), (2, 3), (3, 8)):      # the stored pixels stay; the upright frame turns
        h, w = sizes[k]
        _replace_record(tmp_path / "s.ff", k, orientation=o, height=w if o >= 5 else h, width=h if o >= 5 else w)
    store = Store(tmp_path / "s.ff")
    for size in (128, 64):                      # 64: the decode is larger than the cpu loader's: fitted
        cfg = LoaderConfig(imgsz=size, batch_size=4, workers=0, augment=False, shuffle=False)
        host = run(store, cfg)
        import fastfeed.loaders.device.loader as loader_mod

        monkeypatch.setattr(loader_mod, "make_decoder", lambda name, device: StoredFrameDecoder())
        with create_loader("device", store, cfg) as loader:
            assert loader.host.ship == "encoded"
            dev = collect(loader)
        monkeypatch.undo()
        for (a, ta), (h, th) in zip(dev, host):
            assert torch.equal(ta, th)
            diff = (a.int() - h.int()).abs()
            # 64: a full decode + antialiased resize against libjpeg-turbo's DCT half scale: close, not equal
            assert (diff.max() == 0) if size == 128 else (diff.float().mean() < 6)


def test_payloads_that_do_not_fit_the_slot_travel_through_the_queue(painted, monkeypatch):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, hyp=NO_COLOUR, seed=2)
    want = run(painted, cfg)
    import fastfeed.loaders.device.host as host_mod

    monkeypatch.setattr(host_mod, "slot_bytes", lambda store, cfg, ship: 30_000)   # about one image of four
    with create_loader("device", painted, cfg) as loader:
        assert loader.host.slot_bytes == 30_000
        assert same(collect(loader), want)


# --- the VRAM tier ---------------------------------------------------------------------------------

def test_the_vram_tier_gives_the_same_batches(painted):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, seed=5)
    want = run(painted, cfg, epochs=(0, 1))
    loader = create_loader("device", painted, cfg, cache="device", cache_reserve_gb=0)
    assert loader.host.ship == "none" and loader.vram_bytes == sum(h * w * 3 for h, w in
                                                                       [painted.record(i).size for i in range(24)])
    assert same([b for e in (0, 1) for b in collect(loader, e)], want)
    loader.close()
    with pytest.raises(RuntimeError, match="closed, which freed its VRAM tier; create a new loader"):
        iter(loader)


def test_a_vram_tier_that_does_not_fit_says_what_would(painted, monkeypatch):
    import fastfeed.loaders.device.cache as cache_mod

    need = sum(h * w * 3 for h, w in [painted.record(i).size for i in range(24)])
    work = cache_mod.working_bytes(4, 160, torch.device("cpu"))
    monkeypatch.setattr(cache_mod, "free_memory", lambda device: (need // 2 + work, 10 * 2**30))
    with pytest.raises(DeviceCacheError, match=r"cache='device' needs 0\.0 GiB for 24 images at imgsz 160, plus .* "
                                               r"cpu has \d+\.\d GiB free of 10\.0 GiB\. At imgsz \d+ it would need about"):
        create_loader("device", painted, LoaderConfig(imgsz=160, batch_size=4), cache="device", cache_reserve_gb=0)


# --- the side stream, against a fake CUDA module ---------------------------------------------------

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


def test_stream_protocol_on_a_fake_accelerator(painted):
    """All device work on one side stream; a batch's `copied` event synchronised before the workers' next
    batch is asked for (its slot is then reused); the consumer waits on the batch's `ready` event; record_stream
    on what is handed out (the prefetcher's check, tests/test_prefetch.py)."""
    from test_prefetch import FakeDeviceModule, RecordingOps, _check_protocol

    from fastfeed.loaders.device import DeviceOptions
    from fastfeed.loaders.device.loader import DeviceLoader

    log = []
    mod = FakeDeviceModule(log)
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2, seed=1)
    loader = DeviceLoader(painted, cfg, DeviceOptions(decoder="host"), ops=RecordingOps(mod, torch.device("cuda")),
                          device=torch.device("cuda"))
    want = run(painted, cfg, epochs=(0, 1))
    loader.feed.loader = LoggedHost(loader.host, log)
    got_all = []
    for epoch in range(2):
        del log[:]
        loader.set_epoch(epoch)
        got = []
        for b in loader:
            got.append((b, len(log)))
            got_all.append((u8(b.images), b.targets.clone()))
            log.append(("use", len(got) - 1))
        assert len(got) == len(loader) == 6
        _check_protocol(log, got)
        assert any(e[0] == "copy" for e in log)
    assert len(mod.streams) == 1 and same(got_all, want)
    loader.close()


_NPU_SCRIPT = """
import sys, types, torch
sys.path.insert(0, sys.argv[2])
from test_prefetch import FakeDeviceModule, RecordingOps, _check_protocol
from test_device_loader import LoggedHost, u8, run, same
from fastfeed import Store
from fastfeed.loaders import LoaderConfig
from fastfeed.loaders.device import DeviceOptions
from fastfeed.loaders.device.loader import DeviceLoader
torch.set_num_threads(1)
torch.utils.rename_privateuse1_backend("npu")        # what torch_npu does: torch.device("npu", 0) is valid
log = []
fake = FakeDeviceModule(log)
fake.is_available, fake.current_device, fake.device_count = (lambda: True), (lambda: 0), (lambda: 1)
sys.modules["torch_npu"] = types.ModuleType("torch_npu")
torch.npu = fake
store = Store(sys.argv[1])
cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2, seed=1, device="npu")
device = cfg.resolved_device()
assert device == torch.device("npu", 0), device
loader = DeviceLoader(store, cfg, DeviceOptions(), ops=RecordingOps(fake, device), device=device)
assert loader.decoder.name == "host", loader.decoder.name     # no nvJPEG on an NPU
loader.feed.loader = LoggedHost(loader.host, log)
loader.set_epoch(0)
got, batches = [], []
for b in loader:
    got.append((b, len(log)))
    batches.append((u8(b.images), b.targets.clone()))
    log.append(("use", len(got) - 1))
_check_protocol(log, got)
assert len(fake.streams) == 1
assert same(batches, run(store, LoaderConfig(imgsz=64, batch_size=4, workers=2, seed=1, device="cpu")))
loader.close()
print("npu ok")
"""


def test_stream_protocol_on_a_fake_npu(painted, tmp_path):
    """device="npu" through fastfeed.devices (torch_npu and torch.npu faked, in a child process: naming the
    backend "npu" cannot be undone): the host decoder, the same side-stream protocol, the CPU path's batches."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "npu.py"
    script.write_text(_NPU_SCRIPT)
    tests = str(Path(__file__).resolve().parent)
    p = subprocess.run([sys.executable, str(script), str(painted.path), tests], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "npu ok" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


# --- how the trainer and the bench use it ------------------------------------------------------------

def test_the_trainer_uses_it_as_it_is(painted):
    """fastfeed.train.device.device_batches returns an on_device loader itself (no prefetcher); what the trainer
    must pass: LoaderConfig(device=<its device>) and the loader option dtype=<its AMP dtype>."""
    from fastfeed.prefetch import DevicePrefetcher
    from fastfeed.train.device import device_batches

    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, device="cpu")
    with create_loader("device", painted, cfg, dtype="bfloat16") as loader:
        feed = device_batches(loader, torch.device("cpu"), torch.bfloat16)
        assert feed is loader
        feed.set_epoch(0, 2)
        batches = list(feed)
        assert len(batches) == len(loader) - 2 and batches[0].images.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="already yields batches on cpu: iterate it directly"):
            DevicePrefetcher(loader, "cpu")


def test_fastfeed_bench_runs_it_without_a_copy_stage(painted):
    from fastfeed.bench import BenchConfig, format_table, run_bench

    res = run_bench(BenchConfig(data=painted.path, loaders=("cpu", "device"), imgsz=64, batch_size=4, workers=1,
                                batches=4, progress=False))
    cpu, dev = res.results
    assert dev.ok and not dev.copy_applicable and dev.images_per_s.median > 0
    assert {"read", "plan", "decode", "augment"} <= {k for k, v in dev.stage_ms_per_sample.items() if v > 0}
    assert "batches come out on the device" in " ".join(dev.notes)
    assert "device" in format_table(res)


# --- statistics against the cpu loader -------------------------------------------------------------

def _stats(name: str, store, cfg: LoaderConfig, epochs: int) -> dict:
    """Boxes per image, box width/height quantiles, the share of fill (114 grey) pixels, over `epochs` epochs."""
    per_image, wh, fill = [], [], []
    with create_loader(name, store, cfg) as loader:
        for e in range(epochs):
            loader.set_epoch(e)
            for images, targets in loader:
                x = u8(images) if images.is_floating_point() else images
                fill.append((x == cfg.hyp.fill).all(1).float().mean((1, 2)))
                per_image.append(torch.bincount(targets[:, 0].long(), minlength=len(x)).float())
                wh.append(targets[:, 4:6])
    q = torch.quantile(torch.cat(wh), torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9]), dim=0)
    return {"images": len(torch.cat(per_image)), "boxes_per_image": torch.cat(per_image).mean().item(),
            "fill": torch.cat(fill).mean().item(), **{f"q{k}": v for k, v in enumerate(q.flatten().tolist())}}


@pytest.fixture(scope="module")
def coco128_store(coco128, tmp_path_factory):
    out = tmp_path_factory.mktemp("coco128") / "s.ff"
    run_pack(coco128, out, workers=2)
    return Store(out)


def _assert_stats_close(store, imgsz: int, epochs: int, images: int) -> None:
    cfg = LoaderConfig(imgsz=imgsz, batch_size=16, workers=2, seed=5, hyp=NO_COLOUR)   # no HSV: fill stays 114
    cpu, dev = _stats("cpu", store, cfg, epochs), _stats("device", store, cfg, epochs)
    assert cpu["images"] == dev["images"] == images
    for k in cpu:
        assert abs(dev[k] - cpu[k]) <= 0.05 * abs(cpu[k]), f"{k}: device {dev[k]:.4f} vs cpu {cpu[k]:.4f}"


def test_augmentation_statistics_match_the_cpu_loaders(coco128_store):
    """256 coco128 mosaics at 192: boxes per image, box-size quantiles and fill within 5% of the cpu loader's."""
    _assert_stats_close(coco128_store, 192, 2, 256)


@pytest.mark.slow
def test_augmentation_statistics_match_the_cpu_loaders_over_1024_images(coco128_store):
    _assert_stats_close(coco128_store, 320, 8, 1024)


def test_epoch_order_is_the_samplers(painted):
    """Letterboxed, unshuffled batches hold the store's records in epoch_batches' order."""
    cfg = LoaderConfig(imgsz=160, batch_size=4, workers=2, augment=False, shuffle=True, seed=3)
    order = np.concatenate(epoch_batches(24, 4, epoch=1, seed=3))
    cpu = []
    with create_loader("cpu", painted, cfg) as loader:
        loader.set_epoch(1)
        cpu = [b.targets.clone() for b in loader]
    dev = [t for _, t in run(painted, cfg, epochs=(1,))]
    assert len(order) == 24 and all(torch.equal(a, b) for a, b in zip(cpu, dev))


# --- on a real GPU (pytest -m gpu; benchmarks/gpu_check_device.py checks the same on a bare GPU machine) ----

@pytest.fixture(scope="module")
def sample_store(tmp_path_factory, sample_dir):
    out = tmp_path_factory.mktemp("sample") / "s.ff"
    run_pack(sample_dir, out)
    return Store(out)


@pytest.mark.gpu
def test_gpu_batches_have_the_cpu_paths_targets_and_pixels(sample_store):
    """nvJPEG on the GPU against libjpeg-turbo on the host: the same plans, so the same targets; pixels within
    a few levels. Training batches too (the draws are the host's, whatever the device)."""
    for augment in (False, True):
        cfg = dict(imgsz=320, batch_size=8, workers=2, augment=augment, seed=2, hyp=NO_COLOUR)
        gpu = run(sample_store, LoaderConfig(device="cuda", **cfg))
        cpu = run(sample_store, LoaderConfig(device="cpu", **cfg))
        for (a, ta), (b, tb) in zip(gpu, cpu):
            assert a.device.type == "cuda" and torch.equal(ta.cpu(), tb)
            assert (a.cpu().float() - b.float()).abs().mean() < 4.0


@pytest.mark.gpu
def test_gpu_vram_tier_gives_the_jpeg_paths_batches(sample_store):
    cfg = LoaderConfig(imgsz=320, batch_size=8, workers=2, seed=3, device="cuda")
    want = run(sample_store, cfg, epochs=(0, 1))
    assert same(run(sample_store, cfg, epochs=(0, 1), cache="device", cache_reserve_gb=0), want)


def test_mixup_is_refused_not_ignored(painted):
    from fastfeed.augment import AugmentHyp

    with pytest.raises(ValueError, match="the device loader does not blend mixup samples"):
        create_loader("device", painted, LoaderConfig(imgsz=64, batch_size=4, device="cpu", hyp=AugmentHyp(mixup=0.2)))
