"""A loader's cost per image at two revisions of fastfeed, alternated in one sitting (a refactor's check).

    python benchmarks/ab_revisions.py --base REV [--loader cpu --loader shm] [--task segment ...] [--rounds 5] [--epochs 3]

The base revision is checked out into a temporary git worktree and imported from there (PYTHONPATH); the
working tree is the other side. Each round runs base, then this tree, each in a fresh process over the same
store (coco128 by default, packed once with this tree's fastfeed): the loader in the process itself
(workers=0, imgsz 640, batch 16, training augmentation) for --epochs epochs after one warm-up batch. What
is compared is the CPU time of that process per image, which a busy machine disturbs far less than wall time;
the median over rounds and its ratio are printed, with the spread. `--task` (repeatable) measures a task's store
too: coco128 made into that task's set (`task_sets.make_task_set`: its polygons, their outlines' rectangles, or
template keypoints on its persons), read with its geometry into the batches.
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
from common import REPO, default_source  # noqa: E402
from task_sets import make_task_set  # noqa: E402

RUNNER = textwrap.dedent("""
    import json, sys, time
    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader
    store_path, name, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    opts = {"cache_dir": sys.argv[4], "cache_keep": True} if name == "shm" else {}
    cfg = LoaderConfig(imgsz=640, batch_size=16, workers=0, seed=0)
    with create_loader(name, Store(store_path), cfg, **opts) as loader:
        loader.set_epoch(0)
        next(iter(loader))                       # warm: the first decode, the shm cache's build
        c0, t0, n = time.process_time(), time.perf_counter(), 0
        for e in range(1, epochs + 1):
            loader.set_epoch(e)
            for images, _ in loader:
                n += len(images)
        print(json.dumps({"cpu_ms": 1e3 * (time.process_time() - c0) / n, "wall_ms": 1e3 * (time.perf_counter() - t0) / n}))
""")


def one(tree: Path, store: Path, name: str, epochs: int, cache: Path) -> dict:
    env = os.environ | {"PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", RUNNER, str(store), name, str(epochs), str(cache)], env=env, cwd=tree,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare this working tree against")
    ap.add_argument("--loader", action="append", choices=("cpu", "shm"), help="repeatable (default: cpu)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data", type=Path, help="a COCO/YOLO folder (default: coco128)")
    ap.add_argument("--task", action="append", choices=("detect", "segment", "pose", "obb"),
                    help="repeatable (default: detect): each on coco128's task set (task_sets.py)")
    args = ap.parse_args()
    loaders = args.loader or ["cpu"]
    task_list = args.task or ["detect"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=REPO, check=True)
        try:
            results = {}
            for task, name in [(t, n) for t in task_list for n in loaders]:
                store = tmp / f"{task}.ff"
                if not store.exists():
                    src = args.data or default_source()
                    if task != "detect":
                        src = make_task_set(task, tmp / f"{task}-src", src).parent
                    subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(src), "-o", str(store), "--quiet",
                                    "--task", task, *(["--format", "coco"] if task == "detect" and not args.data else [])],
                                   check=True, cwd=REPO)
                name_ = f"{name} {task}"
                rows = {"base": [], "this": []}
                for r in range(args.rounds):
                    for side, tree in (("base", base), ("this", REPO)):
                        cache = tmp / f"shm-{side}"
                        cache.mkdir(exist_ok=True)
                        rows[side].append(one(tree, store, name, args.epochs, cache))
                    print(f"{name_} round {r + 1}: base {rows['base'][-1]['cpu_ms']:.2f} ms, this {rows['this'][-1]['cpu_ms']:.2f} "
                          "ms CPU per image", flush=True)
                results[name_] = rows
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=False)
    print(f"\nCPU ms per image in the loading process (workers=0, imgsz 640, batch 16), {args.rounds} alternated rounds; "
          f"base {args.base}")
    for name, rows in results.items():
        b = [x["cpu_ms"] for x in rows["base"]]
        t = [x["cpu_ms"] for x in rows["this"]]
        mb, mt = statistics.median(b), statistics.median(t)
        print(f"  {name:12} base {mb:6.2f} (min {min(b):.2f}, max {max(b):.2f})   this {mt:6.2f} (min {min(t):.2f}, "
              f"max {max(t):.2f})   this/base {mt / mb:.3f} (min/min {min(t) / min(b):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
