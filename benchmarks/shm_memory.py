"""How much memory the node spends on the `shm` loader's cache when several ranks share it.

    python benchmarks/shm_memory.py [--images 2048] [--ranks 2] [--workers 2] [--batches 60]

Ranks are simulated as torchrun starts them: fresh processes (spawn), each creating an `shm` loader
with rank=r, world_size=R and iterating batches with training augmentation; each loader has its
worker processes. Measured while every rank is still attached:

  /dev/shm growth     statvfs of /dev/shm before the loaders exist and after the batches: the one cache
                      slab (the loaders' batch slots are an anonymous shared mapping since 8297a71, not in
                      /dev/shm: a page of them shared by a rank and its worker is in neither USS; PSS counts it)
  private growth      the sum over every rank and worker of USS growth (pages only that process maps),
                      leaving out its maps of /dev/shm files, which the line above already counts once
                      (a cache page touched by one worker only is "private" to it in USS terms, but it
                      is a page of the slab, not a copy)
  PSS cross-check     the same with PSS: ranks share pages with their forked workers, which a USS sum
                      misses; a PSS sum counts every page once

and compared with one copy of the cache (the slab's size). Goal: <= 1.3x one copy.
Set-up: coco128 replicated to --images real JPEGs (or the bundled sample), imgsz 640, batch 16.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, machine, replicate_coco  # noqa: E402

SHM = "/dev/shm"
MiB = 2**20


def shm_used() -> int:
    st = os.statvfs(SHM)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def private_bytes(pid: int) -> tuple[int, int, int]:
    """(USS as psutil counts it, USS without maps of /dev/shm files, PSS without them) of `pid`, from
    /proc/pid/smaps. PSS splits each page among the processes that map it, so a sum of PSS over a set
    of processes counts each of their physical pages once."""
    uss = outside = pss = 0
    in_shm = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                in_shm = len(head) == 6 and head[5].startswith(SHM + "/")
            elif head and head[0] in ("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:"):
                kb = int(head[1]) * 1024
                uss += kb
                outside += 0 if in_shm else kb
            elif head and head[0] == "Pss:" and not in_shm:
                pss += int(head[1]) * 1024
    return uss, outside, pss


def rank_main(store_path: str, rank: int, world: int, args: dict, conn) -> None:
    """One rank: report ready (imports done), build the loader on 'go', iterate, report, wait, close."""
    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    store = Store(store_path)
    conn.send(("ready", os.getpid()))
    assert conn.recv() == "go"
    cfg = LoaderConfig(imgsz=args["imgsz"], batch_size=args["batch"], workers=args["workers"], rank=rank,
                       world_size=world)
    t0 = time.perf_counter()
    loader = create_loader("shm", store, cfg)
    built = time.perf_counter() - t0
    n, epoch = 0, 0
    while n < args["batches"]:
        loader.set_epoch(epoch)
        epoch += 1
        for _ in loader:
            n += 1
            if n >= args["batches"]:
                break
    conn.send(("done", {"workers": loader.memory_pids(), "slab": str(loader.lease.path),
                        "slab_bytes": loader.shared_bytes(), "built": loader.lease.built, "setup_s": built,
                        "images_s": n * args["batch"] / (time.perf_counter() - t0), "batches": n,
                        "slot_bytes": args["workers"] * cfg.batches_ahead * args["batch"] * 3 * args["imgsz"] ** 2}))
    assert conn.recv() == "close"
    loader.close()
    conn.send(("closed", None))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2048, help="dataset size (coco128 replicated)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="workers per rank")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batches", type=int, default=60, help="batches per rank")
    args = ap.parse_args()
    print(f"machine: {machine()}", flush=True)

    with tempfile.TemporaryDirectory(prefix="ffshmmem-") as tmp:
        tmp = Path(tmp)
        data = replicate_coco(default_source(), tmp / "data", args.images)
        store = tmp / "data.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--format", "coco", "-o", str(store), "--quiet"],
                       check=True, capture_output=True)

        ctx = mp.get_context("spawn")                     # as torchrun: fresh interpreters, nothing inherited
        pipes, procs = [], []
        for r in range(args.ranks):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=rank_main, args=(str(store), r, args.ranks, vars(args), child))
            p.start()
            pipes.append(parent)
            procs.append(p)
        try:
            rank_pids = [c.recv()[1] for c in pipes]      # every rank has imported what it needs
            before_shm = shm_used()
            before = {pid: private_bytes(pid) for pid in rank_pids}
            for c in pipes:
                c.send("go")
            reports = [c.recv()[1] for c in pipes]
            after_shm = shm_used()
            pids = rank_pids + [w for rep in reports for w in rep["workers"]]
            after = {pid: private_bytes(pid) for pid in pids}
            for c in pipes:
                c.send("close")
            for c in pipes:
                c.recv()
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
        left = [p for p in os.listdir(SHM) if p.startswith("fastfeed-") and Path(reports[0]["slab"]).name in p]

    one = reports[0]["slab_bytes"]
    shm_growth = after_shm - before_shm
    def growth(k: int) -> int:
        return sum(after[p][k] - before.get(p, (0, 0, 0))[k] for p in pids)

    uss_total, uss_private, pss = growth(0), growth(1), growth(2)
    slots = sum(rep["slot_bytes"] for rep in reports)
    node = shm_growth + uss_private
    builds = sum(rep["built"] for rep in reports)
    print(f"\n{args.images} images, imgsz {args.imgsz}, batch {args.batch}: {args.ranks} ranks x {args.workers} workers "
          f"on one node, {args.batches} batches per rank (training augmentation)")
    print(f"  slabs built: {builds} (one per node); every rank attached to {Path(reports[0]['slab']).name}")
    for r, rep in enumerate(reports):
        print(f"  rank {r}: built={rep['built']}, loader ready in {rep['setup_s']:.1f} s, {rep['images_s']:.0f} images/s "
              f"over {rep['batches']} batches (incl. set-up)")
    print(f"  one copy of the cache (slab size)   {one / MiB:9.1f} MiB")
    print(f"  /dev/shm growth (statvfs)              {shm_growth / MiB:9.1f} MiB  "
          f"(expected: the cache {one / MiB:.1f}; the loaders' batch slots, {slots / MiB:.1f}, live outside it)")
    print(f"  private growth (USS, {len(pids)} processes)   {uss_private / MiB:9.1f} MiB  (/dev/shm maps left out)")
    print(f"  node total                             {node / MiB:9.1f} MiB  = {node / one:.2f}x one copy (goal <= 1.3x; "
          f"the batch slots, which any loader has, are in the PSS line below; a copy per rank: "
          f">= {args.ranks}x)")
    print(f"  cross-check with PSS instead of USS: {pss / MiB:.1f} MiB growth, node total "
          f"{(shm_growth + pss) / MiB:.1f} MiB = {(shm_growth + pss) / one:.2f}x one copy, "
          f"{(shm_growth + pss - slots) / one:.2f}x without the batch slots (a USS sum misses pages the ranks "
          "share with their forked workers; a PSS sum counts each page once)")
    print(f"  (USS with /dev/shm maps included, as psutil reports it: {uss_total / MiB:.1f} MiB; it counts a cache page "
          "as private to the one process that touched it, though it is a page of the one slab)")
    print(f"  left in /dev/shm after every rank closed: {left or 'nothing'}")
    return 0 if max(node, shm_growth + pss) <= 1.3 * one and not left else 1


if __name__ == "__main__":
    sys.exit(main())
