"""A store in object storage against the same store on local disk, in one run:

    python benchmarks/remote_store.py [--images 1024] [--shard-mb 4] [--epochs 2] [--rounds 2] [--workers 1] [--bandwidth-mb 100]

A real S3 API (moto's server, `pip install -e '.[dev]'`) runs on 127.0.0.1 in a child process and takes the pack;
the store is then read from a plain object server of its objects in that child (`s3_helpers.ObjectServer`: GET
and HEAD with a range, moto's CPU per request left out; `--moto` reads from moto), behind the test helpers' fault
proxy (`tests/s3_helpers.py`), which adds latency (and jitter) per request, a bandwidth cap shared by every
connection (the node's link) and, in one case, reset connections. With two cores or more, the loader's worker has
one of its own from its fork, everything else (this process, the read-ahead, the child) another (`--no-pin`). The `cpu` loader (batch
16, `--workers`) reads a replicated coco128 packed twice, locally and into the bucket, the shard cache held to
40% of the store (`--cache-share`, so the windowed order runs). The cases run back to back in this one process
(their ratios are of the same harness on the same machine), `--rounds` times, interleaved:

- 0, 20 and 50 ms latency (+-25% jitter) at the bandwidth cap; and a store 3x the cache (the cache a third of it)
  at 0 ms and at 100 ms with 1% of requests' connections reset mid-response;
- each remote run against the mean of the local runs just before and just after it ("of local"), and against the
  0 ms case with the same cache in the same round ("of 0 ms": what latency alone costs, the harness's own cost
  - the S3 server and proxy on this machine's cores - divided out), and that once more by the worker's own clock
  ("by the worker's waits": the local runs' time a sample in every stage but the read, plus the run's read, which
  holds every wait for a download; a machine shared with other work moves the rates, not the waits);
- time to the first batch from a cold cache, against the local first batch plus one request and one shard's
  transfer at the cap;
- whether every epoch delivered its order's batches, each record once (records exact), and the requests cut;
- the link as the read-ahead measured it (bandwidth, delay, downloads in flight, `ReadAhead.figures`);
- what the windowed order does to training batches, against the global shuffle on the same store: classes per
  batch, source shards per batch, and the share of mosaics repeating a tile (from the cpu loader's own plans).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import default_source, machine, replicate_coco  # noqa: E402
from s3_helpers import FaultProxy, ObjectServer, S3Server, moto_missing  # noqa: E402

import fastfeed.store.objstore as objstore  # noqa: E402
from fastfeed import Store  # noqa: E402
from fastfeed.augment import AugmentHyp, batch_rng, draw_batch  # noqa: E402
from fastfeed.loaders import LoaderConfig, create_loader  # noqa: E402
from fastfeed.loaders.partners import history  # noqa: E402
from fastfeed.loaders.sampler import ShuffledOrder  # noqa: E402
from fastfeed.loaders.shard_order import default_order  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402
from fastfeed.store.remote.link import link_words  # noqa: E402


def _network(conn) -> None:
    """In a child process (its own GIL): the S3 server, and fault proxies made and stopped on request through
    `conn`, in front of it or, once asked to `serve` buckets, of an `ObjectServer` of their objects."""

    server, proxies = S3Server(), {}
    target = server.port
    conn.send(server.port)
    while True:
        cmd, arg = conn.recv()
        if cmd == "serve":
            target = ObjectServer.copy_of(server.endpoint, arg).port
            conn.send(target)
        elif cmd == "proxy":
            p = FaultProxy(target, **arg)
            proxies[p.port] = p
            conn.send(p.url)
        elif cmd == "stop":
            p = proxies.pop(arg)
            p.stop()
            conn.send({"requests": p.requests, "dropped": p.dropped})
        else:
            server.stop()
            conn.send(None)
            return


class Network:
    """The child process of `_network`, seen from here."""

    def __init__(self):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_network, args=(child,), daemon=True)
        self.proc.start()
        self.port = self.conn.recv()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.use(self.endpoint)

    def use(self, endpoint: str) -> None:
        S3Server.use(self, endpoint)

    def serve(self, *buckets: str) -> None:
        """Proxies made from now on read `buckets` (as they are now) from a plain object server, not moto."""
        self.conn.send(("serve", list(buckets)))
        self.conn.recv()

    def proxy(self, **kw) -> str:
        self.conn.send(("proxy", kw))
        return self.conn.recv()

    def stop_proxy(self, url: str) -> dict:
        self.conn.send(("stop", int(url.rsplit(":", 1)[1])))
        return self.conn.recv()

    def bucket(self, prefix: str) -> str:
        import uuid

        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return name

    def cpu_seconds(self) -> float:
        """CPU the S3 server and its proxies have used (they share this machine's cores with the loader)."""
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self.conn.send(("quit", None))
        self.conn.recv()
        self.proc.join(10)


@dataclass
class Case:
    """One remote case: its latency (+-25% jitter), the shard cache's limit, the share of requests whose connection
    is reset, and the case through the same harness without latency it is measured against."""

    name: str
    ms: int
    limit: int
    drop: float = 0.0
    zero: str = "0ms"


CASES = ("0ms", "20ms", "50ms", "3x-0ms", "3x-100ms-reset")   # `run`'s cases, by name
PIN: dict = {}   # {"worker": core, "rest": core}: the loader's worker on a core of its own (--pin)


def run_epochs(store, cfg, epochs: int, window_batches: int | None = None) -> dict:
    """Iterate `epochs` epochs; images/s overall and after `window_batches` batches, time to the first batch, and
    the stages' ms per sample after the first batch (the first batch's wait for its shard is the first batch's)."""
    t0 = time.perf_counter()
    first = after_t = None
    n = after_n = 0
    seen = [[] for _ in range(epochs)]
    with create_loader("cpu", store, cfg) as loader:
        order = loader.order
        for e in range(epochs):
            loader.set_epoch(e)
            for k, b in enumerate(loader):
                now = time.perf_counter()
                if first is None:
                    first = now - t0
                    at_first = loader.stage_times()
                    at_first = (dict(at_first.seconds), at_first.samples)
                n += len(b.indices)
                seen[e].append(b.indices.numpy().copy())
                if window_batches is not None and e == 0 and k == window_batches:
                    after_t, after_n = now, n
        st = loader.stage_times()
        described = order.describe()   # with the link's figures (a URL store's read-ahead, in this process)
    total = time.perf_counter() - t0
    later = max(st.samples - at_first[1], 1)
    ms = {k: 1e3 * (v - at_first[0].get(k, 0.0)) / later for k, v in st.seconds.items()}
    out = {"read_ms_per_sample": ms["read"], "decode_ms_per_sample": ms["decode"], "stage_ms_per_sample": ms,
           "first_batch_s": first,
           "images_per_s": n / (total - first) if total > first else None,
           "order": described, "exact": exact(order, seen, len(store), cfg.batch_size)}
    if after_t is not None:
        out["images_per_s_after_window"] = (n - after_n) / (time.perf_counter() - after_t)
    return out


def exact(order, seen: list, n: int, batch: int) -> bool:
    """Whether every epoch delivered its order's batches, in order, each record once (with drop_last: all but the
    tail the batch size leaves)."""
    for e, got in enumerate(seen):
        got = np.concatenate(got) if got else np.zeros(0, np.int64)
        if (not np.array_equal(got, np.concatenate(order.batches(e))) or len(np.unique(got)) != len(got)
                or len(got) != n // batch * batch):
            return False
    return True


def batch_stats(order, store, cfg, epochs=1) -> dict:
    """Classes per batch, shards per batch, mosaics repeating a tile: what the order does to training batches."""
    classes = [np.unique(store.record(i, check_crc=False).classes) for i in range(len(store))]
    starts = np.array([s.start for s in store.shards])
    pb = min(len(store), 8 * cfg.batch_size, 1000)
    w = max(cfg.workers, 1)
    n_cls, n_shards, repeats = [], [], []
    for e in range(epochs):
        batches = order.batches(e)
        for k, b in enumerate(batches):
            n_cls.append(len(np.unique(np.concatenate([classes[int(i)] for i in b]))))
            n_shards.append(len(np.unique(np.searchsorted(starts, b, side="right"))))
            cands = history(order.batches, e, k + 1, k % w, w, pb)
            plans = draw_batch(batch_rng(cfg.seed, order.rank, e, k), len(b), cfg.hyp, cfg.imgsz, mosaic_on=True,
                               mixup_on=False, candidates=len(cands))
            for j, p in enumerate(plans):
                if p.geometry.partners:
                    tiles = [int(b[j])] + [int(cands[q]) for q in p.geometry.partners]
                    repeats.append(len(set(tiles)) < len(tiles))
    return {"classes_per_batch": float(np.mean(n_cls)), "shards_per_batch": float(np.mean(n_shards)),
            "mosaics_repeating_a_tile": float(np.mean(repeats)) if repeats else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--shard-mb", type=float, default=4.0, help="shard size (small, so the store has many)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1,
                    help="loader workers (1 on a 2-core machine: the S3 server and proxy run here too)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--bandwidth-mb", type=float, default=100.0,
                    help="the proxy's cap, MB/s for all connections (100: about a 1 Gb/s link)")
    ap.add_argument("--cache-share", type=float, default=0.4)
    ap.add_argument("--rounds", type=int, default=2, help="remote runs per latency, each between two local runs")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="leave the loader's worker unpinned (by default it gets a core of its own and everything else "
                         "- this process, the read-ahead threads, the S3 server and proxy - the other: the work a remote "
                         "store adds never takes the worker's core, as on a node with cores to spare)")
    ap.add_argument("--moto", action="store_true",
                    help="read the store from moto's S3 server (by default moto takes the pack, then a plain object "
                         "server in the same child process serves its objects: moto's CPU per request, on the core "
                         "the read-ahead uses, was the harness's own cost)")
    ap.add_argument("--cases", help="only these cases, comma-separated (0ms, 20ms, 50ms, 3x-0ms, 3x-100ms-reset), each with "
                    "the 0 ms case it is measured against: a quicker look at one latency")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cases and (unknown := set(args.cases.split(",")) - set(CASES)):
        ap.error(f"--cases: no case {', '.join(sorted(unknown))}; the cases are {', '.join(CASES)}")
    if (why := moto_missing()) is not None:
        print(why)
        return 1
    work = Path(tempfile.mkdtemp(prefix="fastfeed-remote-bench-"))
    try:
        return run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)   # the replicated source, both stores, every cold cache


def run(args, work: Path) -> int:
    src = replicate_coco(default_source(), work / "src", args.images)
    if args.pin and len(os.sched_getaffinity(0)) >= 2:   # the network's work (here: its server too) on another core
        cores = sorted(os.sched_getaffinity(0))
        PIN.update(worker=cores[0], rest=cores[1])
        os.sched_setaffinity(0, {cores[1]})
        # each loader worker on its core from its fork (the S3 server, spawned, is not forked from here): pinned
        # after its first batch, it built that batch on the core of the read-ahead, the S3 server and the proxy
        os.register_at_fork(after_in_child=lambda: os.sched_setaffinity(0, {PIN["worker"]}))
    objstore.PART_BYTES = 1 << 20   # a 4 MB shard in 4 ranged reads, as a 128 MB one is 8 of 16 MB
    server = Network()
    bucket = server.bucket("bench")
    url = f"s3://{bucket}/coco.ff"
    for out in (work / "local.ff", url):
        pack(PackConfig(src=src, out=out, format="coco", shard_mb=args.shard_mb, progress=False))
    if not args.moto:
        server.serve(bucket)
    local = Store(work / "local.ff")
    size = sum(s.bytes for s in local.shards)
    largest = max(s.bytes for s in local.shards)
    limit = int(size * args.cache_share)
    cfg = LoaderConfig(imgsz=args.imgsz, batch_size=16, workers=args.workers, seed=0, hyp=AugmentHyp())
    bw = args.bandwidth_mb * 1e6
    res = {"machine": machine(), "images": len(local), "store_bytes": size, "shards": len(local.shards),
           "largest_shard": largest, "cache_limit": limit, "bandwidth_bytes_per_s": bw, "epochs": args.epochs,
           "workers": args.workers, "imgsz": args.imgsz, "pinned": dict(PIN),
           "server": "moto" if args.moto else "plain", "runs": {}}
    print(f"store: {len(local)} images, {len(local.shards)} shards, {size / 2**20:.1f} MiB; shard cache limit "
          f"{limit / 2**20:.1f} MiB ({args.cache_share:.0%}); cap {args.bandwidth_mb:g} MB/s; cpu loader, "
          f"{args.workers} workers, imgsz {args.imgsz}, batch 16, {args.epochs} epochs")

    run_epochs(local, cfg, 1)   # warm-up (page cache, imports), not counted
    base = run_epochs(local, cfg, args.epochs)
    locals_ = [base]
    res["runs"]["local"] = [base]
    print(f"local: {base['images_per_s']:.1f} images/s, first batch {base['first_batch_s']:.2f} s")

    def remote(case: Case, rnd: int) -> dict:
        ms = case.ms
        proxy = server.proxy(latency=ms / 1e3, jitter=ms / 4e3, bandwidth=bw, drop=case.drop, seed=ms + 1000 * rnd)
        server.use(proxy)
        t_open = time.perf_counter()
        store = Store(url, shard_cache=work / f"cache-{case.name}-{rnd}", shard_cache_limit=case.limit)   # cold: its own
        open_s = time.perf_counter() - t_open
        probe = default_order(store, cfg, 0, 1)
        per_shard = len(store) / len(store.shards)
        window_batches = int(np.ceil(probe.describe().get("window_shards", 1) * per_shard / cfg.batch_size))
        net0, t0 = server.cpu_seconds(), time.perf_counter()
        r = run_epochs(store, cfg, args.epochs, window_batches)
        net_cores = (server.cpu_seconds() - net0) / (time.perf_counter() - t0)
        fetched = store.cache.fetched()
        by_worker = sum(f["pid"] != os.getpid() for f in fetched)   # the read-ahead was late: the read downloaded it
        store.close()
        server.use(server.endpoint)
        counts = server.stop_proxy(proxy)
        return r | {"case": case.name, "latency_ms": ms, "jitter_ms": ms / 4, "drop": case.drop, "open_s": open_s,
                            "cache_limit": case.limit, "round": rnd, **counts,
                            "fetched_bytes_per_epoch": sum(f["bytes"] for f in fetched) / args.epochs,
                            "downloads": len(fetched), "downloaded_by_the_worker": by_worker,
                            "network_process_cores": net_cores,
                            "one_shard_download_s": largest / bw + ms / 1e3, "store_download_s": size / bw}

    # The cases back to back in this process (their ratios are of the same harness on the same machine), each remote
    # run between two local ones (the machine is shared, its load moves): against their mean; and each latency
    # against 0 ms through the same harness (the same cache) in the same round: what the latency alone costs.
    small = max(int(size / 3), 1)
    cases = [Case("0ms", 0, limit), Case("20ms", 20, limit), Case("50ms", 50, limit),
             Case("3x-0ms", 0, small), Case("3x-100ms-reset", 100, small, drop=0.01, zero="3x-0ms")]
    if args.cases:   # the named ones, and each one's 0 ms reference
        named = set(args.cases.split(","))
        cases = [c for c in cases if c.name in named or any(d.zero == c.name for d in cases if d.name in named)]
    rows: dict[str, list] = {c.name: [] for c in cases}
    for rnd in range(args.rounds):
        for case in cases:
            row = remote(case, rnd)
            after = run_epochs(local, cfg, args.epochs)
            res["runs"]["local"].append(after)
            ref = (locals_[-1]["images_per_s"] + after["images_per_s"]) / 2
            ref_first = (locals_[-1]["first_batch_s"] + after["first_batch_s"]) / 2
            locals_.append(after)
            row |= {"local_around": ref, "vs_local": row["images_per_s"] / ref,
                    "vs_local_after_window": row.get("images_per_s_after_window", 0) / ref,
                    "local_first_batch_s": ref_first}
            zero = next((r for r in rows[case.zero] if r["round"] == rnd), None)
            row["vs_0ms"] = row["vs_local"] / zero["vs_local"] if zero else 1.0
            # The same with the CPU divided out: the worker's time a sample at the local runs' work (every stage but
            # the read) plus this run's read, which holds each wait for a download, against the 0 ms run's read
            busy = np.mean([sum(r["stage_ms_per_sample"].values()) - r["read_ms_per_sample"] for r in locals_[-2:]])
            row["vs_0ms_waits_only"] = (busy + (zero or row)["read_ms_per_sample"]) / (busy + row["read_ms_per_sample"])
            rows[case.name].append(row)
            link = row["order"].get("link") or {}
            print(f"round {rnd} {case.name:>14} ({case.limit / size:.0%} cache, {case.drop:.0%} resets): "
                  f"{row['images_per_s']:.1f} images/s, {row['vs_0ms']:.2f} of 0 ms ({row['vs_0ms_waits_only']:.2f} by "
                  f"the worker's waits), {row['vs_local']:.2f} of local "
                  f"({ref:.1f}); first batch {row['first_batch_s']:.2f} s (local {ref_first:.2f} + one request and one "
                  f"shard {row['one_shard_download_s']:.2f}; the store opened in {row['open_s']:.2f} s); records {'exact' if row['exact'] else 'NOT EXACT'}; "
                  f"{row['dropped']} of {row['requests']} requests cut; {row['downloaded_by_the_worker']} of "
                  f"{row['downloads']} downloads by the worker; window {row['order'].get('window_shards')} "
                  f"shards, {row['order'].get('read_ahead_shards')} ahead; link {link_words(link) if link else '-'}; "
                  f"S3 server and proxy {row['network_process_cores']:.2f} cores")
    res["runs"].update(rows)
    res["summary"] = {}
    for case in cases:
        rs = rows[case.name]
        v, z, w = [r["vs_local"] for r in rs], [r["vs_0ms"] for r in rs], [r["vs_0ms_waits_only"] for r in rs]
        late = [r["first_batch_s"] - r["local_first_batch_s"] - r["one_shard_download_s"] for r in rs]
        res["summary"][case.name] = {"vs_0ms_median": float(np.median(z)), "vs_0ms": z, "vs_0ms_waits_only": w,
                                     "vs_local_median": float(np.median(v)), "vs_local": v,
                                     "first_batch_late_s": late, "exact": all(r["exact"] for r in rs)}
        print(f"{case.name:>14}: {np.median(z):.2f} of 0 ms ({min(z):.2f}-{max(z):.2f}; by the worker's waits "
              f"{min(w):.2f}-{max(w):.2f}), {np.median(v):.2f} of local "
              f"({min(v):.2f}-{max(v):.2f}); first batch beyond local + one request and one shard: "
              f"{max(late):+.2f} s at most; records {'exact' if res['summary'][case.name]['exact'] else 'NOT EXACT'} "
              f"in all {len(rs)} runs")

    stats = {"global": batch_stats(ShuffledOrder.for_loader(len(local), cfg, 0, 1), local, cfg, args.epochs)}
    for name, lim in (("windowed", limit), ("windowed-3x", small)):
        order = default_order(Store(url, shard_cache=work / "cache-probe", shard_cache_limit=lim), cfg, 0, 1).base
        stats[name] = batch_stats(order, local, cfg, args.epochs) | {"window_shards": order.window}
    res["batches"] = stats
    for name, st in stats.items():
        print(f"{name:>11} order: {st['classes_per_batch']:.2f} classes per batch, {st['shards_per_batch']:.2f} shards "
              f"per batch, {st['mosaics_repeating_a_tile']:.3f} of mosaics repeat a tile"
              + (f" (a window of {st['window_shards']} shards)" if "window_shards" in st else ""))
    server.stop()
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
