"""What `remote_store.py`'s harness itself takes to deliver shards, with nothing else running in this process:

    python benchmarks/link_probe.py [--images 128] [--shard-mb 0.45] [--rounds 3] [--latency-ms 0 20]

The same harness as remote_store.py (a plain object server and the fault proxy in a spawned child, this process and
that child on one core, as remote_store.py pins them), the same replicated coco128 packed into the bucket. For each
latency (no jitter, the 100 MB/s cap): the time one shard takes to download into a cold shard cache
(`RemoteShards.fetch`, as the read-ahead calls it), then the times at which six more shards, started together on six
threads as a first batch's are, have each arrived. Against remote_store.py's first-batch figures, this says what
part of the first batch's wait is the harness's delivery and what part the loader's own start beside it (the fork
of its worker, on the core the server and proxy use).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from remote_store import Network, default_source, moto_missing, replicate_coco  # noqa: E402

from fastfeed import Store  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402

TOGETHER = 6   # shards started together (a first batch's, in remote_store.py's case)


def together(provider, shards) -> list[float]:
    """Seconds after their start at which `shards`, downloaded together (a thread each), have each arrived."""
    ends: list[float] = []
    lock = threading.Lock()

    def fetch(k: int) -> None:
        provider.fetch(k)
        with lock:
            ends.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=fetch, args=(k,)) for k in shards]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sorted(ends)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--shard-mb", type=float, default=0.45)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--bandwidth-mb", type=float, default=100.0)
    args = ap.parse_args()
    if (why := moto_missing()) is not None:
        print(why)
        return 1
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:   # as remote_store.py: this process and the network child on one core
        os.sched_setaffinity(0, {cores[1]})
    work = Path(tempfile.mkdtemp(prefix="fastfeed-link-probe-"))
    net = Network()
    try:
        src = replicate_coco(default_source(), work / "src", args.images)
        bucket = net.bucket("probe")
        url = f"s3://{bucket}/coco.ff"
        pack(PackConfig(src=src, out=url, format="coco", shard_mb=args.shard_mb, progress=False))
        net.serve(bucket)
        for rnd in range(args.rounds):
            for ms in args.latency_ms:
                proxy = net.proxy(latency=ms / 1e3, jitter=0.0, bandwidth=args.bandwidth_mb * 1e6, drop=0.0, seed=rnd)
                net.use(proxy)
                store = Store(url, shard_cache=work / f"cache-{rnd}-{ms:g}")
                shards = store.provider.shards
                if len(shards) <= TOGETHER:
                    print(f"the store has {len(shards)} shards: pack more images (--images)")
                    return 1
                t = time.perf_counter()
                store.provider.fetch(0)
                one = time.perf_counter() - t
                ends = together(store.provider, range(1, TOGETHER + 1))
                mb = sum(s.bytes for s in shards[1:TOGETHER + 1]) / 1e6
                print(f"round {rnd}, {ms:g} ms: one shard ({shards[0].bytes / 1e6:.2f} MB) in {one * 1e3:.1f} ms; "
                      f"{TOGETHER} together ({mb:.2f} MB) arrived at " + " ".join(f"{e * 1e3:.0f}" for e in ends)
                      + " ms", flush=True)
                store.close()
                net.use(net.endpoint)
                net.stop_proxy(proxy)
    finally:
        net.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
