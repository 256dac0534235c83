"""GPU check of DALI's `mixed` path, for a GPU machine (PyTorch + DALI, plus this source tree).

    python benchmarks/gpu_check_dali.py [--quick] [--json FILE] [--allow-cpu]

1. decode: the bundled sample's 16 JPEGs (fastfeed/sample_data, read as plain files) through
   `fn.decoders.image(device="mixed")`, then decode + resize to 640, in batches of 64: images/s;
2. loader: when fastfeed's own dependencies are installed too (lmdb, OpenCV, simplejpeg...), the
   bundled sample is packed to a temporary store and the `dali` loader runs on the GPU: the Batch
   contract (uint8 [B,3,S,S] on the GPU, float32 [M,6] targets in range), the same letterboxed eval
   batch as DALI's CPU path (targets equal, pixels within a few levels: nvJPEG vs libjpeg-turbo),
   then mosaic training batches at 640: images/s. Skipped, with a line saying so, without them.

Exit status: 0 passed (or DALI not installed: "DALI not installed: skipped"), 1 a check failed,
2 no CUDA device (unless --allow-cpu: the same run on DALI's CPU path, a smoke test of this script).
About 30-60 s on a GPU (mostly pipeline builds and the loader's spawned worker).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "fastfeed" / "sample_data" / "coco16"
RESULTS: dict = {}


def _rate(run_once, batches: int, batch: int, sync) -> float:
    """images/s over `batches` runs after 3 warm-up runs."""
    for _ in range(3):
        run_once()
    sync()
    t0 = time.perf_counter()
    for _ in range(batches):
        run_once()
    sync()
    return batches * batch / (time.perf_counter() - t0)


def check_decode(device_id, quick: bool) -> None:
    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types

    files = sorted((SAMPLE / "images" / "train2017").glob("*.jpg"))
    data = [np.fromfile(f, np.uint8) for f in files]
    batch, batches = 64, (10 if quick else 40)
    decoder = "mixed" if device_id is not None else "cpu"

    def source(info):
        return [data[(info.iteration * batch + j) % len(data)] for j in range(batch)],

    sync = torch.cuda.synchronize if device_id is not None else (lambda: None)
    for name, resize in (("decode", False), ("decode+resize640", True)):
        @pipeline_def(batch_size=batch, num_threads=4, device_id=device_id, prefetch_queue_depth=2)
        def pipe(resize: bool):
            enc, = fn.external_source(source, num_outputs=1, batch=True, batch_info=True)
            img = fn.decoders.image(enc, device=decoder, output_type=types.RGB)
            return fn.resize(img, resize_longer=640) if resize else img

        p = pipe(resize)
        p.build()
        first = p.run()[0]
        shape = first.as_cpu().at(0).shape if device_id is not None else first.at(0).shape
        assert len(shape) == 3 and shape[2] == 3, f"decoded sample has shape {shape}"
        ips = _rate(p.run, batches, batch, sync)
        RESULTS[f"{decoder}_{name}_images_per_s"] = round(ips, 1)
        print(f"  {decoder} {name:<18} {ips:8.0f} images/s  ({len(files)} bundled JPEGs, batch {batch}, "
              f"{batches} batches)", flush=True)
        del p


def check_loader(device: str, quick: bool) -> None:
    missing = [m for m in ("lmdb", "cv2", "simplejpeg", "zlib_ng", "orjson", "psutil", "tqdm", "yaml")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"  loader: skipped (fastfeed's own dependencies missing: {', '.join(missing)})", flush=True)
        RESULTS["loader"] = f"skipped: missing {', '.join(missing)}"
        return
    import torch

    sys.path.insert(0, str(REPO))
    from fastfeed.loaders import LoaderConfig, create_loader
    from fastfeed.pack import PackConfig, pack
    from fastfeed.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sample.ff"
        pack(PackConfig(src=SAMPLE, out=out, workers=2, progress=False))
        store = Store(out)
        on_gpu = device != "cpu"

        # Eval batches: the GPU pipeline against DALI's CPU pipeline on the same records.
        kw = dict(imgsz=320, batch_size=8, workers=2, augment=False, shuffle=False)
        with create_loader("dali", store, LoaderConfig(device=device, **kw)) as gpu, \
                create_loader("dali", store, LoaderConfig(device="cpu", **kw)) as cpu:
            gi, gt = next(iter(gpu))
            ci, ct = next(iter(cpu))
        assert gi.device.type == ("cuda" if on_gpu else "cpu"), f"images on {gi.device}"
        assert gi.dtype == torch.uint8 and tuple(gi.shape) == (8, 3, 320, 320), f"images {gi.dtype} {tuple(gi.shape)}"
        torch.testing.assert_close(gt, ct)
        diff = (gi.cpu().float() - ci.float()).abs().mean().item()
        RESULTS["eval_mean_abs_diff_vs_cpu"] = round(diff, 3)
        print(f"  eval batch vs DALI's CPU path: targets equal, mean |pixel diff| {diff:.2f} levels", flush=True)
        assert diff < 4.0, f"the {device} eval batch differs from the CPU one by {diff:.2f} levels on average"

        # Training batches (mosaic, affine, HSV, flips) at 640: contract and throughput.
        # The sample holds 16 images: one batch an epoch, so many short epochs (each also exercises
        # DALI's end-of-epoch reset and the next epoch's prefetch).
        cfg = LoaderConfig(imgsz=640, batch_size=16, workers=8 if on_gpu else 2, seed=0, device=device)
        with create_loader("dali", store, cfg) as loader:
            t0, images, epochs = None, 0, (2 if not on_gpu else 12 if quick else 40)
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for b in loader:
                    if t0 is None:      # the first batch (pipeline build, worker start) is not timed
                        t0 = time.perf_counter()
                        continue
                    x, t = b.images, b.targets
                    assert x.dtype == torch.uint8 and tuple(x.shape) == (16, 3, 640, 640) and x.is_contiguous()
                    assert t.dtype == torch.float32 and t.shape[1] == 6 and bool(((t[:, 2:] >= 0) & (t[:, 2:] <= 1)).all())
                    images += len(x)
            if on_gpu:
                torch.cuda.synchronize()
            ips = images / (time.perf_counter() - t0)
        RESULTS["loader_train_640_images_per_s"] = round(ips, 1)
        print(f"  dali loader ({device}, mosaic, 640, batch 16): {ips:.0f} images/s over {images} images; "
              "Batch contract ok", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer timed batches")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--allow-cpu", action="store_true", help="without a GPU, run DALI's CPU path instead")
    args = ap.parse_args()
    try:
        import nvidia.dali as dali
    except ImportError:
        print("DALI not installed: skipped")
        return 0
    import torch

    if torch.cuda.is_available():
        device_id, device = torch.cuda.current_device(), f"cuda:{torch.cuda.current_device()}"
        where = f"{torch.cuda.get_device_name(device_id)} ({device})"
    elif args.allow_cpu:
        device_id, device, where = None, "cpu", "no GPU: DALI's CPU path (--allow-cpu)"
    else:
        print("gpu_check_dali: torch sees no CUDA device (use --allow-cpu for a CPU smoke run)", file=sys.stderr)
        return 2
    print(f"--- dali  DALI {dali.__version__}, torch {torch.__version__}, {where}", flush=True)
    RESULTS.update(dali=dali.__version__, torch=torch.__version__, device=where)
    failed = []
    for name, fn, arg in (("decode", check_decode, device_id), ("loader", check_loader, device)):
        try:
            fn(arg, args.quick)
        except Exception as e:  # noqa: BLE001 - report, run the other check, exit 1
            import traceback

            traceback.print_exc()
            failed.append(f"{name}: {type(e).__name__}: {e}")
            print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    RESULTS["failures"] = failed
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(RESULTS, indent=1) + "\n")
    print("gpu_check_dali: " + ("ok" if not failed else f"{len(failed)} check(s) failed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":   # the loader's DALI workers are spawned once CUDA is up: keep this guard
    sys.exit(main())
