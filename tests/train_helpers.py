"""What the trainer's test files share: tiny settings, the packed bundled sample, metrics.jsonl rows."""

from __future__ import annotations

import json
from contextlib import contextmanager

import torch

import fastfeed
from fastfeed.pack import PackConfig, pack
from fastfeed.train import coco_ground_truth
from fastfeed.train.evaluate import to_coco_detections

TINY = dict(model="yolov3-tiny", imgsz=64, batch=2, epochs=2, workers=0, accum=1, log_every=1)


def packed_sample(tmp_path_factory):
    """The bundled 16-image sample, packed (each test file's module-scoped `store` fixture)."""
    out = tmp_path_factory.mktemp("train") / "sample.ff"
    pack(PackConfig(src=fastfeed.sample_path(), out=out, progress=False))
    return out


def rows(run_dir, event=None):
    """metrics.jsonl rows with this `event` (None: the log rows)."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("event") == event]


def fixed_batch(store, n, imgsz=64):
    """The store's first n images, letterboxed, float in [0,1], with their targets."""
    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    ld = create_loader("cpu", Store(store), LoaderConfig(imgsz=imgsz, batch_size=n, workers=0, augment=False,
                                                         shuffle=False))
    images, targets = next(iter(ld))
    images, targets = images.float() / 255, targets.clone()
    ld.close()
    return images, targets


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def same_weights(a: torch.nn.Module, b: torch.nn.Module, rtol=1e-5, atol=1e-6) -> None:
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(va.float(), vb.float(), rtol=rtol, atol=atol), k


def gt_as_detections(store, imgsz):
    """The val loader's own targets, as the model would have predicted them (letterboxed pixels)."""
    from fastfeed.loaders import LoaderConfig, create_loader
    from fastfeed.train.boxes import cxcywh_to_xyxy

    gt, frames = coco_ground_truth(store, imgsz)
    ld = create_loader("cpu", store, LoaderConfig(imgsz=imgsz, batch_size=5, workers=0, augment=False, shuffle=False,
                                                  drop_last=False))
    dets, seen = [], 0
    for images, targets in ld:
        for j in range(len(images)):
            t = targets[targets[:, 0] == j]
            d = torch.cat((cxcywh_to_xyxy(t[:, 2:6] * imgsz), torch.ones(len(t), 1), t[:, 1:2]), 1)
            dets += to_coco_detections(d, frames[seen], store.category_ids)
            seen += 1
    ld.close()
    assert seen == len(store)
    return gt, dets


# --- `fastfeed train` in a child process (signals, kills) ----------------------------------------------------

def train_args(store, out, **flags) -> list[str]:
    """`fastfeed train` arguments for TINY's settings, plus `flags` (name=value; True for a bare flag)."""
    args = ["train", "--data", str(store), "--out", str(out), "--quiet"]
    for k, v in (TINY | flags).items():
        if v is not False and v is not None:
            args += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return args


def start_train(args: list[str], *, slow_steps: float = 0.0, slow_from: int = 1, marker=None):
    """`python -m fastfeed <args>` in its own session (so the test can signal its whole process group, as SLURM
    and torchrun do, and kill whatever is left by group); one thread, so runs compare bit for bit.
    `slow_steps`: each optimizer step from step `slow_from` on (1-based) sleeps that long first (a step long
    enough to signal inside it); with `marker` (a path), a line is appended to it as each step starts (so a test
    knows a step is in flight)."""
    import os
    import subprocess
    import sys

    code = ("import sys, time\n"
            "import fastfeed.train.loop as loop\n"
            "real, started = loop.optimizer_step, [0]\n"
            "def slow(*a, **k):\n"
            "    started[0] += 1\n"
            + (f"    open({str(marker)!r}, 'a').write('step\\n')\n" if marker else "")
            + f"    if started[0] >= {slow_from}:\n        time.sleep({slow_steps})\n"
            "    return real(*a, **k)\n"
            "loop.optimizer_step = slow\n"
            "from fastfeed.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    cmd = [sys.executable, "-c", code, *args] if slow_steps else [sys.executable, "-m", "fastfeed", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def finish(proc, timeout: float = 300) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a start_train process; its group is killed if it overruns."""
    import os
    import signal
    import subprocess

    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"fastfeed train did not exit within {timeout} s:\n{err[-3000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # whatever the run left behind (nothing, normally)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def wait_for_rows(run_dir, n: int, proc=None, event=None, timeout: float = 300.0) -> list[dict]:
    """Poll metrics.jsonl until it has `n` rows of `event` (None: log rows); fails if `proc` exits first."""
    import time

    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.is_file():
            lines = []
            for x in path.read_text().splitlines():
                try:
                    lines.append(json.loads(x))
                except ValueError:   # a line being written
                    break
            got = [r for r in lines if r.get("event") == event]
            if len(got) >= n:
                return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {n} rows:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.01)
    raise AssertionError(f"no {n} rows in {path} within {timeout} s")


# --- DDP with gloo in the test's own child processes ---------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gloo_rank(rank: int, world: int, port: int):
    """This process as rank `rank` of a `world`-process gloo group on 127.0.0.1:`port` (one torch thread each,
    so runs compare bit for bit)."""
    import gc
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
        # what train() wrapped in DDP is gone before the group is (not merely unreachable: no collection ran)
        assert not [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)], "a DDP outlived the run"
    finally:
        dist.destroy_process_group()


def join_ranks(ctx, timeout: float = 300.0) -> None:
    """Wait for torch.multiprocessing ranks; kill them all if any is still running at `timeout` (a rank left
    waiting in a collective would otherwise hang the test)."""
    import time

    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, f"the ranks did not finish within {timeout:.0f} s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
