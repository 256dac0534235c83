"""An object-storage outage mid-epoch: `fastfeed train` from s3:// says when its retries start, writes last.pt at the
last finished step when they give up, exits with one line naming the failure and --resume, and --resume then
continues from that step once the store is reachable again. The S3 server is moto's; the outage is a proxy in front
of it that stops (connections refused from then on); the retry backoff is shortened in the child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from s3_helpers import FaultProxy
from train_helpers import finish

from fastfeed import Store
from fastfeed.loaders.workers import WorkerError
from fastfeed.pack import PackConfig, pack
from fastfeed.store.objstore import RemoteError, RemoteMissing
from fastfeed.train import load_checkpoint
from fastfeed.train.guards import source_failure

IMAGES, SHARDS, BATCH = 48, 12, 4          # one batch per shard: the epoch keeps reading new shards
STEP_S = 0.3                                # each step sleeps this long first: the outage starts mid-epoch

# `fastfeed train` with the retry backoff shortened and each step slowed (the env names the endpoint and options).
CHILD = ("import sys, time\n"
         "import fastfeed.store.objstore as o\n"
         "o.BACKOFF_S = (0.01, 0.05)\n"
         "import fastfeed.train.loop as loop\n"
         "real = loop.optimizer_step\n"
         f"def slow(*a, **k):\n    time.sleep({STEP_S})\n    return real(*a, **k)\n"
         "loop.optimizer_step = slow\n"
         "from fastfeed.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")


@pytest.fixture(autouse=True)
def _env(remote_env):
    """`fastfeed` flags set the environment the Stores read: put back after each test."""


@pytest.fixture(scope="module")
def remote(s3, tmp_path_factory):
    from conftest import CocoBuilder

    root = tmp_path_factory.mktemp("outage")
    b = CocoBuilder(root / "coco")
    for k in range(IMAGES):
        b.add_image(f"{k:03d}.jpg", h=64, w=80, seed=k, boxes=[(1 + 2 * (k % 2), [4, 4, 30, 24])])
    b.write()
    url = f"s3://{s3.bucket()}/outage.ff"
    pack(PackConfig(src=root / "coco", out=url, shards=SHARDS, workers=1, progress=False))
    pack(PackConfig(src=root / "coco", out=root / "local.ff", shards=SHARDS, workers=1, progress=False))
    return url, sum(s.bytes for s in Store(root / "local.ff").shards)


def _start(remote, out, cache, endpoint, *extra):
    url, size = remote
    cmd = [sys.executable, "-c", CHILD, "train", "--data", url, "--out", str(out), "--model", "yolov3-tiny", "--imgsz",
           "64", "--batch", str(BATCH), "--epochs", "1", "--workers", "1", "--accum", "1", "--log-every", "1",
           "--no-augment", "--quiet", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AWS_ENDPOINT_URL": endpoint, "FASTFEED_SHARD_CACHE": str(cache),
           "FASTFEED_SHARD_CACHE_LIMIT": str(size * 6 // 10), "FASTFEED_READ_AHEAD_SHARDS": "1",
           "FASTFEED_STORAGE_OPTIONS": json.dumps({"config_kwargs": {"retries": {"max_attempts": 1},
                                                                     "connect_timeout": 2}})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)


def _steps(out) -> int:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    n = 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            break
        n = max(n, row.get("step", 0) if "event" not in row else 0)
    return n


@pytest.mark.slow
def test_an_s3_outage_mid_epoch_writes_last_pt_and_resume_continues(remote, s3, tmp_path):
    url, out, cache = remote[0], tmp_path / "run", tmp_path / "cache"
    proxy = FaultProxy(s3.port)
    try:
        p = _start(remote, out, cache, proxy.url)
        deadline = time.monotonic() + 120
        while _steps(out) < 2:
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-3000:]
            time.sleep(0.02)
    finally:
        proxy.stop()                                    # the outage: from now on every connection is refused
    rc, _, err = finish(p)
    assert rc == 1, err[-3000:]
    assert "S3 unreachable (" in err and "retrying for up to 0 s of backoff (5 more tries" in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("fastfeed: error: ") and "failed 6 times" in line and str(url) in line
    ck = load_checkpoint(out / "last.pt")
    step = ck["step"]
    assert 2 <= step < IMAGES // BATCH and ck["batches_done"] == step and ck["epoch"] == 0
    assert f"training stopped at epoch 1, step {step} ({step} of {IMAGES // BATCH} batches): {out / 'last.pt'} " \
           "holds the last finished step: continue with the same command and --resume" in line
    saved = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["why"] for r in saved if r.get("event") == "checkpoint"] == ["data source failed"]
    assert max(r["step"] for r in saved if "event" not in r) == step   # no step after the last one logged is lost

    with FaultProxy(s3.port) as again:                  # the store is back: --resume continues from that step
        rc, _, err = finish(_start(remote, out, cache, again.url, "--resume", "--json"))
    assert rc == 0, err[-3000:]
    assert f"resumed at step {step}: resuming epoch 1 after {step} batches per rank: the batches an uninterrupted " \
           "run trains next" in err
    assert load_checkpoint(out / "last.pt")["step"] == IMAGES // BATCH


def test_a_remote_error_from_a_loader_worker_is_recognised_and_nothing_else_is():
    """How a worker's failure reaches the trainer: a WorkerError with the worker's traceback, whose last line names
    the exception's class (a RemoteError subclass counts; another exception, or a look-alike name, does not)."""
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
          "fastfeed.store.objstore.RemoteMissing: reading s3://b/x.ff/shard-00001.mdb: not found\n")
    assert source_failure(WorkerError(f"loader worker 0 failed on batch 3 of epoch 0:\n{tb}")) == \
        "reading s3://b/x.ff/shard-00001.mdb: not found"
    assert source_failure(RemoteMissing("reading s3://b/x: not found")) == "reading s3://b/x: not found"
    assert source_failure(RemoteError("downloading s3://b/x failed 6 times")) is not None
    for text in ("ValueError: bad", "builtins.ValueError: bad", "fastfeed.store.format.RecordCorrupt: record 3",
                 "nope.RemoteError: x", "loader worker 0 (pid 1) exited unexpectedly with code -9"):
        assert source_failure(WorkerError(f"loader worker 0 failed:\n{text}")) is None, text
    assert source_failure(ValueError("x")) is None
