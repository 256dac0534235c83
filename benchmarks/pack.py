"""Pack throughput against the decode-only floor, and Store random reads against loose files.

    python benchmarks/pack.py                 # coco128 replicated to 1,024 images, all cores
    python benchmarks/pack.py --quick         # the bundled sample, a few seconds (make demo)

Everything runs in one process tree, one after the other, so the ratios compare like with like
on a shared, noisy machine. Reads are measured with a warm page cache (both sides).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, machine, replicate_coco  # noqa: E402

from fastfeed import Store, codec  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402

# --- workers (module level so they pickle) ---------------------------------------------------------

def _decode_file(path: str) -> int:
    with open(path, "rb") as f:
        return codec.decode_jpeg(f.read()).shape[0]


def _read_store(args) -> int:
    path, order = args
    store = Store(path)
    n = 0
    for i in order:
        s = store.get(int(i), decode=False)
        n += len(s.data) + len(s.boxes)
    return n


def _read_loose(args) -> int:
    files, order, with_labels = args
    n = 0
    for i in order:
        img, label = files[i]
        with open(img, "rb") as f:
            n += len(f.read())
        if with_labels:
            with open(label) as f:
                rows = [line.split() for line in f.read().splitlines() if line]
            n += len(np.asarray(rows, np.float32).reshape(-1, 5))
    return n


# --- measurements ------------------------------------------------------------------------------------

def timed(fn, *args, repeat=3):
    """Best of `repeat` wall times (the least disturbed run on a shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def decode_floor(files: list[str], workers: int) -> float:
    chunk = max(1, len(files) // (workers * 16))
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_file, files[:workers * 2])  # start-up outside the timing
        return timed(lambda: pool.map(_decode_file, files, chunksize=chunk), repeat=2)


def parallel_reads(fn, make_args, n: int, workers: int) -> float:
    rng = np.random.default_rng(0)
    order = rng.permutation(n)
    if workers == 1:
        return timed(fn, make_args(order))
    parts = np.array_split(order, workers)
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(fn, [make_args(p[:8]) for p in parts])
        return timed(lambda: pool.map(fn, [make_args(p) for p in parts]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, help="COCO-layout source (default: coco128 if present, else the sample)")
    ap.add_argument("--images", type=int, default=1024, help="replicate the source to this many images")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--quick", action="store_true", help="bundled sample, 64 images: a smoke run")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    if args.quick:
        import fastfeed

        args.src, args.images = args.src or fastfeed.sample_path(), 64
    src = args.src or default_source()
    W = args.workers
    res: dict = {"machine": machine(), "source": str(src), "images": args.images, "workers": W}
    with tempfile.TemporaryDirectory(prefix="ffbench-") as tmp:
        tmp = Path(tmp)
        data = replicate_coco(src, tmp / "src", args.images)
        files = sorted(str(p) for p in (data / "images" / "train2017").glob("*.jpg"))
        mb = sum(os.path.getsize(f) for f in files) / 1e6
        _decode_file(files[0])
        t_decode = decode_floor(files, W)

        def do_pack(store="original", **kw):
            out = tmp / f"{store}.ff"
            pack(PackConfig(src=data, out=out, format="coco", store=store, workers=W, overwrite=True, progress=False,
                            **kw))
            return out

        t_pack = timed(do_pack, repeat=2)
        t_full = timed(lambda: do_pack(check="full"), repeat=2)
        t_jpeg = timed(lambda: do_pack("jpeg", max_side=640, quality=90), repeat=1)
        t_raw = timed(lambda: do_pack("raw", max_side=640), repeat=1)
        store_path = do_pack()
        res |= {"source_mb": round(mb, 1),
                "decode_only_img_s": len(files) / t_decode,
                "pack_original_img_s": len(files) / t_pack, "pack_original_mb_s": mb / t_pack,
                "pack_original_full_check_img_s": len(files) / t_full,
                "pack_jpeg640_img_s": len(files) / t_jpeg, "pack_raw640_img_s": len(files) / t_raw}
        res["pack_vs_decode"] = res["pack_original_img_s"] / res["decode_only_img_s"]
        res["pack_full_check_vs_decode"] = res["pack_original_full_check_img_s"] / res["decode_only_img_s"]

        loose = [(f, str(Path(f.replace("/images/", "/labels/")).with_suffix(".txt"))) for f in files]
        n = len(files)
        _read_store((str(store_path), range(n)))
        _read_loose((loose, range(n), True))  # warm the page cache on both sides
        for w in sorted({1, W}):
            t_store = parallel_reads(_read_store, lambda o: (str(store_path), o), n, w)
            t_nocrc = parallel_reads(_read_store_nocrc, lambda o: (str(store_path), o), n, w)
            t_img = parallel_reads(_read_loose, lambda o: (loose, o, False), n, w)
            t_both = parallel_reads(_read_loose, lambda o: (loose, o, True), n, w)
            res[f"reads_{w}p"] = {"store_rec_s": n / t_store, "store_nocrc_rec_s": n / t_nocrc,
                                  "loose_image_s": n / t_img, "loose_image_label_s": n / t_both,
                                  "store_vs_loose_image_label": t_both / t_store,
                                  "store_vs_loose_image_only": t_img / t_store}
    print_table(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


def _read_store_nocrc(args) -> int:
    path, order = args
    store = Store(path, check_crc=False)
    return sum(len(store.get(int(i), decode=False).data) for i in order)


def print_table(r: dict) -> None:
    m = r["machine"]
    print(f"\nfastfeed pack benchmark: {r['images']} images ({r['source_mb']} MB) from {r['source']}")
    print(f"machine: {m['cores']} cores, {m['ram_gib']} GiB, python {m['python']}, opencv {m['opencv']}, "
          f"simplejpeg {m['simplejpeg']}; {r['workers']} workers\n")
    print(f"  {'decode only (floor)':34} {r['decode_only_img_s']:8.0f} images/s")
    print(f"  {'pack --store original (checked)':34} {r['pack_original_img_s']:8.0f} images/s  "
          f"{r['pack_original_mb_s']:6.1f} MB/s   {r['pack_vs_decode']:.2f}x the decode-only rate")
    print(f"  {'  the same with --check full':34} {r['pack_original_full_check_img_s']:8.0f} images/s  "
          f"{'':17}{r['pack_full_check_vs_decode']:.2f}x the decode-only rate")
    print(f"  {'pack --store jpeg --max-side 640':34} {r['pack_jpeg640_img_s']:8.0f} images/s")
    print(f"  {'pack --store raw --max-side 640':34} {r['pack_raw640_img_s']:8.0f} images/s\n")
    for key in sorted(k for k in r if k.startswith("reads_")):
        x = r[key]
        print(f"  random reads, {key[6:-1]} process(es): Store {x['store_rec_s']:8.0f} rec/s "
              f"(no CRC {x['store_nocrc_rec_s']:.0f}) | loose image+label {x['loose_image_label_s']:8.0f}/s "
              f"-> {x['store_vs_loose_image_label']:.2f}x | loose image only {x['loose_image_s']:8.0f}/s "
              f"-> {x['store_vs_loose_image_only']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
