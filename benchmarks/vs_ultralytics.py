"""fastfeed's loaders against Ultralytics' training dataloader, same images, same cores, one run.

    python benchmarks/vs_ultralytics.py [--images 1024] [--seconds 30] [--rounds 2] [--loader cpu ...] [--aug cutmix=0.5 ...]

Set-up, identical on both sides: coco128 replicated to --images real JPEG files, imgsz 640, batch
16, 2 workers, training augmentation with mosaic, no image cache. Ultralytics runs in its own venv
(`.venv-ultralytics`, created here on first use by `make venv-ultralytics`: the one recipe that the
integration tests and benchmarks/ultralytics_ab.py use too).
Contenders alternate for --rounds rounds and each reports images/s after a warm-up; the median is
compared. The decode-only rate of the same files on every core is printed as the floor. `--aug KEY=VALUE`
(repeatable) turns an augmentation on for both sides (Ultralytics' training argument, fastfeed's `AugmentHyp`
field of the same name): a new augmentation's ratio is read against the ratio without it. Ultralytics applies its
default Albumentations (Blur, MedianBlur, ToGray, CLAHE at p=0.01) whenever `albumentations` is installed, and so
does FastfeedTrainer: both sides apply them unless `--albumentations none` (then neither does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, default_source, machine, replicate_coco  # noqa: E402
from pack import decode_floor  # noqa: E402

ULTRA_VENV = REPO / ".venv-ultralytics"

# Runs inside the Ultralytics venv: its own dataset + dataloader, exactly as its trainer builds them.
ULTRA_RUNNER = textwrap.dedent("""
    import json, sys, time
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG
    img_path, imgsz, batch, workers, seconds, warmup, aug, albu, cache = sys.argv[1:10]
    imgsz, batch, workers, seconds, warmup = int(imgsz), int(batch), int(workers), float(seconds), int(warmup)
    cache = False if cache == "none" else cache
    cfg = get_cfg(DEFAULT_CFG, overrides={"imgsz": imgsz, "batch": batch, "workers": workers, "cache": cache,
                                          **json.loads(aug), **({"augmentations": []} if albu == "none" else {})})
    data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
    ds = build_yolo_dataset(cfg, img_path, batch, data, mode="train")
    dl = build_dataloader(ds, batch=batch, workers=workers, shuffle=True, rank=-1, pin_memory=False, device="cpu")
    t0 = time.perf_counter(); n = 0; marks = []; first = None
    while not marks or marks[-1][0] - t0 < seconds:
        for b in dl:
            now = time.perf_counter()
            first = now - t0 if first is None else first
            n += len(b["img"]); marks.append((now, n))
            if now - t0 >= seconds:
                break
    (ta, na), (tb, nb) = marks[min(warmup, len(marks) - 2)], marks[-1]
    print("RESULT " + json.dumps({"images_s": (nb - na) / (tb - ta), "first_batch_s": first,
                                  "shape": list(b["img"].shape), "dtype": str(b["img"].dtype)}))
""")

# Runs in this venv, in a fresh process like the other side, so neither inherits the other's state.
FF_RUNNER = textwrap.dedent("""
    import json, sys, time
    from fastfeed import Store
    from fastfeed.augment import AugmentHyp
    from fastfeed.loaders import LoaderConfig, create_loader
    path, name, imgsz, batch, workers, seconds, warmup, aug, albu = sys.argv[1:10]
    imgsz, batch, workers, seconds, warmup = int(imgsz), int(batch), int(workers), float(seconds), int(warmup)
    if albu == "default":   # Ultralytics 8.4's default list (what FastfeedTrainer takes from its Albumentations)
        import albumentations as A
        albu = (A.Blur(p=0.01), A.MedianBlur(p=0.01), A.ToGray(p=0.01), A.CLAHE(p=0.01))
    hyp = AugmentHyp(**json.loads(aug), albumentations=albu if albu != "none" else ())
    loader = create_loader(name, Store(path), LoaderConfig(imgsz=imgsz, batch_size=batch, workers=workers, hyp=hyp))
    t0 = time.perf_counter(); n = 0; marks = []; epoch = 0; first = None
    while not marks or marks[-1][0] - t0 < seconds:
        loader.set_epoch(epoch); epoch += 1
        for b in loader:
            now = time.perf_counter()
            first = now - t0 if first is None else first
            n += len(b.images); marks.append((now, n))
            if now - t0 >= seconds:
                break
    (ta, na), (tb, nb) = marks[min(warmup, len(marks) - 2)], marks[-1]
    print("RESULT " + json.dumps({"images_s": (nb - na) / (tb - ta), "first_batch_s": first,
                                  "stages_ms": loader.stage_times().per_sample_ms(),
                                  "shape": list(b.images.shape), "dtype": str(b.images.dtype)}))
    loader.close()
""")


def ensure_ultralytics_venv() -> Path:
    if not (ULTRA_VENV / ".installed").exists():
        print(f"creating {ULTRA_VENV} (make venv-ultralytics) ...", flush=True)
        subprocess.run(["make", "venv-ultralytics"], cwd=REPO, check=True)
    return ULTRA_VENV / "bin" / "python"


def run(cmd: list[str], cwd: Path) -> dict:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][7:])


def aug_json(pairs: list[str] | None) -> str:
    """`--aug KEY=VALUE ...` as the JSON both runners read: numbers as numbers, anything else (a mode) as text."""
    def value(v: str):
        try:
            return float(v)
        except ValueError:
            return v
    return json.dumps({k: value(v) for k, _, v in (a.partition("=") for a in pairs or [])})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0, help="timed run per contender per round")
    ap.add_argument("--warmup", type=int, default=3, help="batches not counted")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loader", action="append", help="fastfeed loaders to run (default: cpu)")
    ap.add_argument("--ultra-cache", default="none", choices=("none", "ram"),
                    help="Ultralytics' image cache for its side (the shm comparison uses ram)")
    ap.add_argument("--aug", action="append", metavar="KEY=VALUE", help="an augmentation on for both sides, e.g. "
                    "cutmix=0.5 (repeatable; Ultralytics' argument and fastfeed's AugmentHyp field)")
    ap.add_argument("--albumentations", choices=("default", "none"), default="default",
                    help="Ultralytics' default Albumentations on both sides (default; needs albumentations in both "
                         "venvs), or on neither")
    ap.add_argument("--paired", action="store_true", help="each round also runs both sides without the --aug "
                    "augmentations, and prints the ratio with them over the ratio without, round by round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.paired and not args.aug:
        ap.error("--paired compares runs with and without --aug: give at least one --aug KEY=VALUE")
    if args.paired:
        return paired(args)
    aug = aug_json(args.aug)
    loaders = args.loader or ["cpu"]
    ultra_py = ensure_ultralytics_venv()
    src = default_source()
    res = {"machine": machine(), "config": vars(args) | {"json": None, "loader": loaders}, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="ffvsul-") as tmp:
        tmp = Path(tmp)
        data = replicate_coco(src, tmp / "data", args.images)
        store = tmp / "data.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--format", "coco", "-o", str(store), "--quiet"],
                       check=True, capture_output=True)
        files = sorted(str(p) for p in (data / "images" / "train2017").glob("*.jpg"))
        res["decode_only_img_s"] = len(files) / decode_floor(files, len(os.sched_getaffinity(0)))
        for r in range(args.rounds):
            rnd = one_round(args, aug, loaders, ultra_py, data, store, tmp)
            res["rounds"].append(rnd)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['images_s']:.0f} img/s" for k, v in rnd.items()), flush=True)
    med = {k: statistics.median(rnd[k]["images_s"] for rnd in res["rounds"]) for k in res["rounds"][0]}
    res["median_images_s"] = med
    base = med["ultralytics"]
    cache = "" if args.ultra_cache == "none" else f' cache="{args.ultra_cache}"'
    print(f"\n{args.images} images, imgsz {args.imgsz}, batch {args.batch}, {args.workers} workers, mosaic on"
          f"{''.join(f', {a}' for a in args.aug or [])}, Albumentations {args.albumentations}; "
          f"median of {args.rounds} rounds of {args.seconds:.0f} s")
    print(f"  {'decode only, all cores (floor)':34} {res['decode_only_img_s']:7.0f} images/s")
    print(f"  {'ultralytics' + cache:34} {base:7.0f} images/s  1.00x")
    for name in loaders:
        print(f"  {'fastfeed ' + name:34} {med[name]:7.0f} images/s  {med[name] / base:.2f}x ultralytics, "
              f"{med[name] / res['decode_only_img_s']:.0%} of decode-only")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


def one_round(args, aug: str, loaders, ultra_py, data: Path, store: Path, tmp: Path) -> dict:
    """Ultralytics, then each fastfeed loader, each in a fresh process: name -> its RESULT."""
    (tmp / "ultra.py").write_text(ULTRA_RUNNER)
    (tmp / "ff.py").write_text(FF_RUNNER)
    common = [str(args.imgsz), str(args.batch), str(args.workers), str(args.seconds), str(args.warmup), aug,
              args.albumentations]
    rnd = {"ultralytics": run([str(ultra_py), str(tmp / "ultra.py"), str(data / "images" / "train2017"),
                               *common, args.ultra_cache], tmp)}
    for name in loaders:
        rnd[name] = run([sys.executable, str(tmp / "ff.py"), str(store), name, *common], tmp)
    return rnd


def paired(args) -> int:
    """`--paired`: per round, both sides without the augmentations and then with them; each round's ratio with
    them over its ratio without (>= 1: the augmentation costs fastfeed no more of its lead), and the median."""
    loaders = args.loader or ["cpu"]
    ultra_py = ensure_ultralytics_venv()
    res = {"machine": machine(), "config": vars(args) | {"json": None, "loader": loaders}, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="ffvsul-") as tmp:
        tmp = Path(tmp)
        data = replicate_coco(default_source(), tmp / "data", args.images)
        store = tmp / "data.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--format", "coco", "-o", str(store),
                        "--quiet"], check=True, capture_output=True)
        for r in range(args.rounds):
            rnd = {side: one_round(args, a, loaders, ultra_py, data, store, tmp)
                   for side, a in (("without", "{}"), ("with", aug_json(args.aug)))}
            res["rounds"].append(rnd)
            print(f"round {r + 1}: " + "; ".join(f"{side}: " + ", ".join(f"{k} {v['images_s']:.0f}" for k, v in
                                                                       x.items()) for side, x in rnd.items()), flush=True)
    print(f"\n{args.images} images, imgsz {args.imgsz}, batch {args.batch}, {args.workers} workers, mosaic on, "
          f"Albumentations {args.albumentations}; with: {', '.join(args.aug)}; {args.rounds} rounds of "
          f"{args.seconds:.0f} s, each side with and without")
    for name in loaders:
        ratios = [{side: x[name]["images_s"] / x["ultralytics"]["images_s"] for side, x in rnd.items()}
                  for rnd in res["rounds"]]
        print(f"  fastfeed {name} / ultralytics, without: " + ", ".join(f"{q['without']:.2f}x" for q in ratios) +
              "; with: " + ", ".join(f"{q['with']:.2f}x" for q in ratios))
        print("  with / without, by round: " + ", ".join(f"{q['with'] / q['without']:.3f}" for q in ratios) +
              f"; median {statistics.median(q['with'] / q['without'] for q in ratios):.3f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
