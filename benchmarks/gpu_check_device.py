"""gpu_check section `device`: the `device` loader on the GPU against the `cpu` loader with every core (see
gpu_check.py). Goals of issue #15 on one H200 at 640, batch 64: >= 8,000 images/s decoding JPEGs (nvJPEG),
>= 30,000 from the VRAM cache, <= 0.2 ms of host CPU per image.

1. store: 1,024 records (the 16 bundled JPEGs x 64). Packed with fastfeed when its store dependencies import;
   on a bare GPU machine (no lmdb/simplejpeg/tqdm/psutil) an in-memory stand-in with the same `record()`
   interface instead, with OpenCV standing in for simplejpeg (full-size decodes: no DCT scaling is needed at
   640 for these <= 640 px images) so the cpu loader can run too;
2. checks: the JPEG path and the VRAM path give identical batches on the GPU (both decode with nvJPEG; a
   stream or caching mistake would show), and letterboxed batches on the GPU have the CPU path's targets
   exactly and its pixels within a few levels (nvJPEG against libjpeg-turbo);
3. throughput, each for a few seconds after warm-up: the cpu loader (every core) + DevicePrefetcher, the device
   loader from JPEG, the device loader from the VRAM cache (and its build time): images/s and host CPU ms per
   image (this process, all threads, plus the loader's worker processes); the device's own decode/augment ms.

`--allow-cpu` runs it all on the CPU, small, as a smoke test of this file (no figures worth keeping).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch
from gpu_common import FAILURES, row, sync

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "fastfeed" / "sample_data" / "coco16"
COPIES = 64


# --- 1. the store ------------------------------------------------------------------------------------

def _stand_ins(missing: list[str]) -> None:
    """Modules fastfeed imports at load time but this check does not need, or needs only a little of."""
    import cv2

    for name in missing:
        mod = types.ModuleType(name)
        if name == "simplejpeg":
            def decode_jpeg(data, colorspace="RGB", min_height=0, min_width=0, strict=True, **kw):
                img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
                if img is None:
                    raise ValueError("OpenCV could not decode the JPEG")
                h, w = img.shape[:2]   # libjpeg-turbo's DCT scaling, emulated: the size codec.dct_size says
                k = next((k for k in range(1, 8) if -(-h * k // 8) >= min_height and -(-w * k // 8) >= min_width), 8)
                if k < 8:
                    img = cv2.resize(img, (-(-w * k // 8), -(-h * k // 8)), interpolation=cv2.INTER_AREA)
                return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)

            mod.decode_jpeg = decode_jpeg
            mod.decode_jpeg_header = lambda data: (*decode_jpeg(data).shape[:2], "YCbCr", "420")
        elif name == "tqdm":
            class Bar:
                def __init__(self, iterable=None, **kw):
                    self.iterable, self.n = iterable, 0

                def __iter__(self):
                    return iter(self.iterable)

                def update(self, k=1):
                    self.n += k

                def close(self, *a, **kw):
                    pass

                set_postfix_str = close

            mod.tqdm = Bar
        elif name == "psutil":   # only fastfeed.devices.free_memory for the CPU (the --allow-cpu smoke run)
            def virtual_memory():
                page = os.sysconf("SC_PAGE_SIZE")
                return types.SimpleNamespace(available=os.sysconf("SC_AVPHYS_PAGES") * page,
                                             total=os.sysconf("SC_PHYS_PAGES") * page)

            mod.virtual_memory = virtual_memory
        sys.modules[name] = mod


class MemoryStore:
    """`Store`'s read interface over records held in memory (no LMDB): record(i) -> fastfeed's Record."""

    def __init__(self, records: list):
        self.records = records
        self.path, self.shards, self.check_crc = Path("<memory>"), [], False
        self.manifest = types.SimpleNamespace(store_mode="original", payload={"store": "original"},
                                              stats={"record_bytes": sum(len(r.payload) for r in records)})

    def __len__(self):
        return len(self.records)

    def record(self, index: int, check_crc=None):
        return self.records[int(index)]

    def close(self):
        pass


def _sample_copies(root: Path | None):
    """(COCO dict, [jpeg bytes]) of the bundled sample replicated COPIES times (files under root, if given)."""
    src = json.loads((SAMPLE / "annotations" / "instances_train2017.json").read_text())
    images, anns, data = [], [], []
    for c in range(COPIES):
        for im in src["images"]:
            new = dict(im, id=len(images) + 1, file_name=f"{c:03d}_{im['file_name']}")
            raw = (SAMPLE / "images" / "train2017" / im["file_name"]).read_bytes()
            if root is not None:
                (root / "images" / "train2017" / new["file_name"]).write_bytes(raw)
            anns += [dict(a, id=len(anns) + k + 1, image_id=new["id"])
                     for k, a in enumerate(a for a in src["annotations"] if a["image_id"] == im["id"])]
            images.append(new)
            data.append(raw)
    return dict(src, images=images, annotations=anns), data


def _memory_store() -> MemoryStore:
    from fastfeed.store.record import Record

    coco, data = _sample_copies(None)
    cats = sorted(c["id"] for c in coco["categories"])
    cls = {c: k for k, c in enumerate(cats)}
    records = []
    for i, (im, raw) in enumerate(zip(coco["images"], data)):
        h, w = im["height"], im["width"]
        mine = [a for a in coco["annotations"] if a["image_id"] == im["id"] and not a["iscrowd"]]
        b = np.array([[x / w, y / h, (x + bw) / w, (y + bh) / h] for x, y, bw, bh in (a["bbox"] for a in mine)],
                     np.float32).reshape(-1, 4).clip(0, 1)
        c = np.array([cls[a["category_id"]] for a in mine], np.int64)
        records.append(Record(i, "memory", "jpeg", h, w, h, w, 1, im["id"], im["file_name"], b, c,
                              np.zeros((0, 4), np.float32), np.zeros(0, np.int64), memoryview(raw)))
    return MemoryStore(records)


def make_store(tmp: Path):
    """(store, how it was made)."""
    missing = [m for m in ("lmdb", "simplejpeg", "tqdm", "psutil") if importlib.util.find_spec(m) is None]
    if missing or os.environ.get("FASTFEED_GPU_CHECK_MEMORY_STORE"):
        _stand_ins(missing)
        return _memory_store(), f"in-memory stand-in ({', '.join(missing) or 'forced'} missing)"
    from fastfeed.pack import PackConfig, pack
    from fastfeed.store import Store

    (tmp / "src" / "images" / "train2017").mkdir(parents=True)
    (tmp / "src" / "annotations").mkdir()
    coco, _ = _sample_copies(tmp / "src")
    (tmp / "src" / "annotations" / "instances_train2017.json").write_text(json.dumps(coco))
    pack(PackConfig(src=tmp / "src", out=tmp / "s.ff", workers=os.cpu_count() or 1, progress=False))
    return Store(tmp / "s.ff"), "fastfeed store"


# --- 2./3. measuring -----------------------------------------------------------------------------------

def _cpu_s(pids) -> float:
    """CPU seconds of other processes (Linux /proc), for the loaders' workers."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _forever(loader):
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        yield from loader


def measure(loader, feed, device, seconds: float, warmup: int = 3) -> tuple[float, float, int]:
    """(images/s, host CPU ms per image, images) consuming `feed` (batches on `device`) for `seconds`."""
    it = _forever(feed)
    for _ in range(warmup):
        next(it)
    sync(device)
    pids = loader.memory_pids()
    c0, t0, n = time.process_time() + _cpu_s(pids), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        n += len(next(it).images)
    sync(device)
    wall = time.perf_counter() - t0
    cpu = time.process_time() + _cpu_s(pids) - c0
    it.close()
    return n / wall, cpu / n * 1e3, n


def _batches(loader, k: int) -> list:
    loader.set_epoch(0)
    out = []
    for b in itertools.islice(loader, k):
        out.append((b.images.float().cpu(), b.targets.cpu()))
    return out


def device_section(device: torch.device, quick: bool) -> None:
    sys.path.insert(0, str(REPO))
    gpu = device.type == "cuda"
    size, batch = (640, 64) if gpu else (128, 8)
    seconds = (2.0 if quick else 5.0) if gpu else 1.0
    with tempfile.TemporaryDirectory() as tmp:
        store, how = make_store(Path(tmp))
        row("device", "store", f"{len(store)} records (16 bundled JPEGs x {COPIES}), {how}")
        from fastfeed.loaders import LoaderConfig, create_loader
        from fastfeed.prefetch import DevicePrefetcher

        tv = importlib.util.find_spec("torchvision") is not None
        decoder = "auto"
        with create_loader("device", store, LoaderConfig(imgsz=size, batch_size=batch, device=str(device))) as ld:
            decoder = ld.decoder.name
        if gpu and decoder == "host":
            row("device", "nvJPEG decoder", f"skipped: neither torchvision nor nvImageCodec decodes here "
                                            f"(torchvision {'installed' if tv else 'missing'}); measuring host decode")

        # --- checks ---
        kw = dict(imgsz=size, batch_size=batch, seed=1, device=str(device))
        with create_loader("device", store, LoaderConfig(**kw)) as a, \
                create_loader("device", store, LoaderConfig(**kw), cache="device", cache_reserve_gb=1.0) as b:
            same = all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(_batches(a, 3), _batches(b, 3)))
        row("device", "JPEG path = VRAM-tier path", "identical batches" if same else "DIFFERENT batches")
        if not same:
            FAILURES.append("device: the JPEG and VRAM-tier paths gave different batches")
        ev = dict(imgsz=size, batch_size=batch, augment=False, shuffle=False)
        with create_loader("device", store, LoaderConfig(**ev, device=str(device))) as a, \
                create_loader("device", store, LoaderConfig(**ev, device="cpu")) as b:
            (ga, ta), (gb, tb) = _batches(a, 1)[0], _batches(b, 1)[0]
        diff = (ga - gb).abs().mean().item() * 255
        ok = torch.equal(ta, tb) and diff < 4.0
        row("device", f"eval batch {device} vs cpu path", f"targets {'equal' if torch.equal(ta, tb) else 'DIFFER'}, "
                                                          f"mean |pixel diff| {diff:.2f} levels")
        if not ok:
            FAILURES.append(f"device: the {device} eval batch differs from the cpu path's (diff {diff:.2f} levels)")

        # --- throughput ---
        workers = os.cpu_count() or 1
        with create_loader("cpu", store, LoaderConfig(imgsz=size, batch_size=batch, workers=workers,
                                                      device=str(device))) as ld:
            feed = DevicePrefetcher(ld, device)
            cpu_ips, cpu_ms, _ = measure(ld, feed, device, seconds)
            feed.close()
        row("device", f"cpu loader {workers} workers + prefetcher", f"{cpu_ips:8.0f} images/s  {cpu_ms:.3f} ms host CPU/img")
        for label, opts in ((f"device loader, JPEG ({decoder})", {}),
                            ("device loader, VRAM cache", {"cache": "device", "cache_reserve_gb": 1.0})):
            t0 = time.perf_counter()
            with create_loader("device", store, LoaderConfig(imgsz=size, batch_size=batch, device=str(device)),
                               **opts) as ld:
                if opts:
                    row("device", "VRAM cache build", f"{time.perf_counter() - t0:.1f} s, "
                                                     f"{ld.vram_bytes / 2**30:.2f} GiB for {len(store)} images")
                ips, ms, n = measure(ld, ld, device, seconds)
                st = ld.stage_times()
            per = {k: 1e3 * v / max(st.samples, 1) for k, v in st.seconds.items()}
            goal = ">= 8,000" if not opts else ">= 30,000"
            row("device", label, f"{ips:8.0f} images/s  {ms:.3f} ms host CPU/img  ({ips / cpu_ips:.1f}x cpu loader; "
                                 f"goal {goal}, <= 0.2 ms)")
            row("device", f"  {'VRAM' if opts else 'JPEG'} stages, ms/img",
                " ".join(f"{k} {v:.3f}" for k, v in per.items() if v))
