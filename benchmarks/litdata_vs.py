"""fastfeed against LitData on the same images, from the same S3 harness, in one run:

    python benchmarks/litdata_vs.py [--images 384] [--shard-mb 0.45] [--ms 50] [--epochs 2] [--rounds 2] \
        [--litdata-python /work/venv-litdata/bin/python]

The harness is `benchmarks/remote_store.py`'s: moto's S3 server in a child process behind the test helpers' fault
proxy (`--ms` latency per request, +-25% jitter, a `--bandwidth-mb` cap shared by every connection). The same
replicated coco128 is packed by fastfeed (shards of `--shard-mb`) and written by `litdata.optimize` (chunks of the
same size) from the very payload bytes of fastfeed's pack; each side's cache holds a third of its store. Each
sample is decoded and letterboxed the same way (libjpeg-turbo through simplejpeg at the smallest DCT scale that
covers the tile, area-resized, letterboxed to `--imgsz` with 114), batches of 16 stacked as uint8 tensors, one
loader worker each, shuffled: fastfeed's `cpu` loader with `augment=False` (its windowed order and read-ahead),
LitData's `StreamingDataset(shuffle=True, max_cache_size=...)` in a `StreamingDataLoader`. LitData runs in its own
virtual environment (`pip install torch==2.13.0 litdata simplejpeg opencv-python-headless`), as a subprocess of
this script (`--side litdata`); the two alternate `--rounds` times, each epoch's images/s printed and the ratios
computed here. Epoch 1 starts from a cold cache; both rates include the wait for the epoch's first batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def letterboxed(payload: bytes, imgsz: int):
    """The LitData side's decode and letterbox: what fastfeed's `Record.decode_tile` and `letterbox` do."""
    import cv2
    import numpy as np
    import simplejpeg

    h, w, _, _ = simplejpeg.decode_jpeg_header(payload)
    r = imgsz / max(h, w)
    th, tw = (max(1, round(h * r)), max(1, round(w * r))) if r < 1 else (h, w)   # the tile: never enlarged
    img = simplejpeg.decode_jpeg(payload, colorspace="RGB", min_height=th, min_width=tw, strict=True)
    if img.shape[:2] != (th, tw):
        img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
    r = imgsz / max(th, tw)
    nw, nh = max(1, min(imgsz, round(tw * r))), max(1, min(imgsz, round(th * r)))
    out = np.full((imgsz, imgsz, 3), 114, np.uint8)
    left, top = (imgsz - nw) // 2, (imgsz - nh) // 2
    if (nw, nh) != (tw, th):
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA if r < 0.5 else cv2.INTER_LINEAR)
    out[top:top + nh, left:left + nw] = img
    return out


# --- the LitData side (its own venv) ---------------------------------------------------------------------------------

def _sample(path: str) -> dict:
    return {"index": int(Path(path).stem), "image": Path(path).read_bytes()}


def litdata_prepare(payloads: Path, out: Path, chunk_bytes: int, endpoint: str, url: str) -> None:
    """`litdata.optimize` the payloads into chunks of `chunk_bytes`, then upload them (straight to the server)."""
    import boto3
    from litdata import optimize

    files = sorted(str(p) for p in payloads.iterdir())
    optimize(fn=_sample, inputs=files, output_dir=str(out), chunk_bytes=chunk_bytes, num_workers=1,
             mode="overwrite")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = boto3.client("s3", endpoint_url=endpoint)
    for p in sorted(out.iterdir()):
        client.upload_file(str(p), bucket, f"{prefix}/{p.name}")


def _allow_http() -> None:
    """LitData downloads chunks through obstore, which refuses a plain-http endpoint (the harness's) unless told."""
    import litdata.streaming.downloader as d

    if "allow_http" not in d._OBSTORE_CLIENT_OPTIONS:
        d._OBSTORE_CLIENT_OPTIONS = {**d._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


def litdata_read(args) -> dict:
    import numpy as np
    import torch
    from litdata import StreamingDataLoader, StreamingDataset

    imgsz = args.imgsz

    class Letterboxed(StreamingDataset):
        def __getitem__(self, index):
            _allow_http()   # in the worker process too
            s = super().__getitem__(index)
            return s["index"], torch.from_numpy(letterboxed(s["image"], imgsz)).permute(2, 0, 1)

    def collate(batch):
        return torch.tensor([i for i, _ in batch]), torch.stack([x for _, x in batch])

    ds = Letterboxed(input_dir=args.url, cache_dir=args.cache_dir, max_cache_size=args.cache_bytes, shuffle=True,
                     seed=0, drop_last=True, storage_options={"endpoint_url": args.proxy})
    loader = StreamingDataLoader(ds, batch_size=16, num_workers=1, collate_fn=collate, drop_last=True)
    rates, seen = [], []
    for e in range(args.epochs):
        ds.set_epoch(e + 1)
        t0, n, got = time.perf_counter(), 0, []
        for idx, _images in loader:
            n += len(idx)
            got.append(idx.numpy())
        rates.append(n / (time.perf_counter() - t0))
        g = np.concatenate(got)
        seen.append({"images": int(n), "distinct": int(len(np.unique(g)))})
    return {"images_per_s": rates, "epochs": seen}


# --- the driver (fastfeed's venv) -------------------------------------------------------------------------------------

def fastfeed_read(url: str, cache: Path, limit: int, args) -> dict:
    import numpy as np

    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    store = Store(url, shard_cache=cache, shard_cache_limit=limit)
    cfg = LoaderConfig(imgsz=args.imgsz, batch_size=16, workers=1, seed=0, augment=False)
    rates, seen = [], []
    with create_loader("cpu", store, cfg) as loader:
        for e in range(args.epochs):
            loader.set_epoch(e)
            t0, n, got = time.perf_counter(), 0, []
            for b in loader:
                n += len(b.indices)
                got.append(b.indices.numpy().copy())
            rates.append(n / (time.perf_counter() - t0))
            g = np.concatenate(got)
            seen.append({"images": int(n), "distinct": int(len(np.unique(g))),
                         "order_exact": bool(np.array_equal(g, np.concatenate(loader.order.batches(e))))})
        described = loader.order.describe()
    store.close()
    return {"images_per_s": rates, "epochs": seen, "window_shards": described.get("window_shards"),
            "link": described.get("link")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=["driver", "litdata-prepare", "litdata"], default="driver")
    ap.add_argument("--images", type=int, default=384)
    ap.add_argument("--shard-mb", type=float, default=0.45)
    ap.add_argument("--ms", type=float, default=50.0)
    ap.add_argument("--bandwidth-mb", type=float, default=100.0)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--litdata-python", default="/work/venv-litdata/bin/python")
    ap.add_argument("--litdata-chunk-mb", type=float, help="LitData's chunk size (default: --shard-mb)")
    ap.add_argument("--litdata-first", action="store_true", help="each round runs LitData before fastfeed")
    ap.add_argument("--json", type=Path)
    # the LitData side's own arguments (given by the driver)
    ap.add_argument("--payloads", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--url")
    ap.add_argument("--endpoint")
    ap.add_argument("--proxy")
    ap.add_argument("--cache-dir")
    ap.add_argument("--cache-bytes", type=int)
    ap.add_argument("--chunk-bytes", type=int)
    args = ap.parse_args()
    if args.side == "litdata-prepare":
        litdata_prepare(args.payloads, args.out, args.chunk_bytes, args.endpoint, args.url)
        return 0
    if args.side == "litdata":
        print(json.dumps(litdata_read(args)))
        return 0
    if not Path(args.litdata_python).exists():
        print(f"no LitData venv at {args.litdata_python}: python3.11 -m venv DIR && DIR/bin/pip install torch==2.13.0 "
              "litdata simplejpeg opencv-python-headless, then --litdata-python DIR/bin/python")
        return 1
    work = Path(tempfile.mkdtemp(prefix="fastfeed-litdata-vs-"))
    try:
        return drive(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def drive(args, work: Path) -> int:
    sys.path.insert(0, str(HERE))
    from common import default_source, machine, replicate_coco
    from remote_store import Network

    from fastfeed import Store
    from fastfeed.pack import PackConfig, pack

    src = replicate_coco(default_source(), work / "src", args.images)
    server = Network()
    bucket = server.bucket("vs")
    ff_url, ld_url = f"s3://{bucket}/coco.ff", f"s3://{bucket}/litdata"
    for out in (work / "local.ff", ff_url):
        pack(PackConfig(src=src, out=out, format="coco", shard_mb=args.shard_mb, progress=False))
    local = Store(work / "local.ff")
    payloads = work / "payloads"
    payloads.mkdir()
    for i in range(len(local)):   # the very bytes fastfeed stores, for LitData to chunk
        (payloads / f"{i:06d}.jpg").write_bytes(bytes(local.record(i).payload))
    ff_bytes = sum(s.bytes for s in local.shards)
    chunk = int((args.litdata_chunk_mb or args.shard_mb) * 2**20)
    env = dict(os.environ, PYTHONPATH="")
    subprocess.run([args.litdata_python, __file__, "--side", "litdata-prepare", "--payloads", str(payloads),
                    "--out", str(work / "ld"), "--chunk-bytes", str(chunk), "--endpoint", server.endpoint,
                    "--url", ld_url], check=True, env=env)
    ld_bytes = sum(p.stat().st_size for p in (work / "ld").iterdir())
    res = {"machine": machine(), "images": len(local), "ms": args.ms, "bandwidth_mb_s": args.bandwidth_mb,
           "fastfeed_store_bytes": ff_bytes, "litdata_store_bytes": ld_bytes, "fastfeed": [], "litdata": []}
    print(f"{len(local)} images; fastfeed {len(local.shards)} shards, {ff_bytes / 2**20:.1f} MiB; LitData "
          f"{sum(1 for p in (work / 'ld').iterdir() if p.suffix == '.bin')} chunks, {ld_bytes / 2**20:.1f} MiB; "
          f"each cache a third of its store; {args.ms:g} ms +-{args.ms / 4:g}, {args.bandwidth_mb:g} MB/s")
    for rnd in range(args.rounds):
        for side in (("litdata", "fastfeed") if args.litdata_first else ("fastfeed", "litdata")):
            proxy = server.proxy(latency=args.ms / 1e3, jitter=args.ms / 4e3, bandwidth=args.bandwidth_mb * 1e6,
                                 seed=rnd)
            if side == "fastfeed":
                server.use(proxy)
                r = fastfeed_read(ff_url, work / f"ff-cache-{rnd}", max(ff_bytes // 3, 1), args)
                server.use(server.endpoint)
            else:
                out = subprocess.run(
                    [args.litdata_python, __file__, "--side", "litdata", "--url", ld_url, "--proxy", proxy,
                     "--cache-dir", str(work / f"ld-cache-{rnd}"), "--cache-bytes", str(max(ld_bytes // 3, 1)),
                     "--epochs", str(args.epochs), "--imgsz", str(args.imgsz)],
                    env=env | {"AWS_ENDPOINT_URL": proxy}, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"the LitData side failed ({out.returncode}):\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
            r["proxy"] = server.stop_proxy(proxy)
            res[side].append(r)
            print(f"round {rnd} {side:>8}: " + ", ".join(f"epoch {e + 1} {v:.1f} images/s"
                                                          for e, v in enumerate(r["images_per_s"]))
                  + f"; {r['epochs']}; {r['proxy']['requests']} requests")
    ratios = [[f / ld for f, ld in zip(a["images_per_s"], b["images_per_s"])]
              for a, b in zip(res["fastfeed"], res["litdata"])]
    res["ratios"] = ratios
    for e in range(args.epochs):
        col = [r[e] for r in ratios]
        print(f"epoch {e + 1}: fastfeed / LitData {sorted(col)[len(col) // 2]:.2f} (rounds: "
              + ", ".join(f"{v:.2f}" for v in col) + ")")
    server.stop()
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0 if all(math.isfinite(v) for r in ratios for v in r) else 1


if __name__ == "__main__":
    raise SystemExit(main())
