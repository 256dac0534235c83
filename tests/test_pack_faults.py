"""A pack that meets a fault leaves nothing behind: killed mid-way (its workers stop, the next pack starts at
once), a full disk (named, the partial store removed, an old store intact), and a process killed between the
steps of a `--force` publish (the next pack or Store() finds a store, old or new, and nothing left over)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import jpeg_bytes
from proc_checks import descendants, kill_all, running, start_script, wait_gone
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.pack import PackError
from fastfeed.store import publish


def _noise_images(builder, n: int, h: int = 240, w: int = 320):
    """Incompressible images (~100 KB each): a few of them fill a small disk."""
    rng = np.random.default_rng(0)
    for k in range(n):
        builder.add_image(f"{k:03d}.jpg", h, w, data=jpeg_bytes(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), 95),
                          boxes=[(1, [10, 10, 50, 40])])
    return builder.write()


def _siblings(out):
    """Everything beside OUT that a pack into OUT wrote (the store itself aside)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# --- killed mid-way ---------------------------------------------------------------------------------------

def _pack_with_a_stuck_worker(yolo_builder, tmp_path, **popen):
    """A `fastfeed pack` of 40 images (2 workers) whose image 20 is a FIFO: reading it blocks until someone writes, so
    a pack worker stays mid-segment. Returns (the process, its workers, the source, the FIFO, OUT) once the workers
    and the pack's .incomplete folder are there."""
    yolo = yolo_builder()
    for k in range(40):
        yolo.add(f"{k:02d}", ["0 0.5 0.5 0.2 0.2"], seed=k)
    stuck = yolo.root / "images" / "train" / "20.jpg"
    stuck.unlink()
    os.mkfifo(stuck)
    out = tmp_path / "out.ff"
    proc = start_script("import sys; from fastfeed.cli import main; sys.exit(main(sys.argv[1:]))",
                        "pack", yolo.root, "-o", out, "--workers", "2", "--shards", "4", "--quiet",
                        stdout=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 120
    while len(workers := descendants(proc.pid)) < 2 or not list(tmp_path.glob(".out.ff.incomplete-*")):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_all([proc, *running(workers)])
            raise AssertionError("the pack never started its workers")
        time.sleep(0.1)
    return proc, workers, yolo.root, stuck, out


def test_a_pack_killed_mid_way_stops_its_workers_and_the_next_pack_starts_at_once(yolo_builder, tmp_path):
    proc, workers, src, stuck, out = _pack_with_a_stuck_worker(yolo_builder, tmp_path)
    try:
        time.sleep(1.0)   # one worker is blocked on the FIFO; the other has finished or is writing
        proc.kill()
        proc.wait(30)
        left = wait_gone(workers, 5.0)
        assert not left, f"pack workers {[p.pid for p in left]} outlived the killed pack"
        stuck.unlink()
        stuck.write_bytes((src / "images" / "train" / "21.jpg").read_bytes())
        t0 = time.monotonic()
        res = run_pack(src, out)            # not refused: the lock went with the killed pack
        assert time.monotonic() - t0 < 60 and len(Store(res.out)) == 40
        assert _siblings(out) == []         # its .incomplete folder was removed, the lock file too
    finally:
        kill_all([proc, *running(workers)])
        proc.wait()


def test_a_pack_starts_no_more_workers_than_it_has_parts(yolo_builder, tmp_path, monkeypatch):
    """`--workers 64` on a set of two parts: two processes, not 64 (each would cost a fork and its start-up)."""
    from fastfeed.procs import GuardedContext

    yolo = yolo_builder()
    for k in range(6):
        yolo.add(f"{k}", ["0 0.5 0.5 0.2 0.2"], seed=k)
    sizes, pool = [], GuardedContext.Pool
    monkeypatch.setattr(GuardedContext, "Pool", lambda self, n=None, *a, **kw: sizes.append(n) or pool(self, n, *a, **kw))
    assert len(Store(run_pack(yolo.root, tmp_path / "out", workers=64, shards=2).out)) == 6
    assert sizes == [2]


def test_a_ctrl_c_stops_a_pack_with_its_one_line_and_no_workers_traceback(yolo_builder, tmp_path):
    """A Ctrl-C reaches the terminal's whole process group: the pool's workers leave it to the pack, which says one line
    (exit 130), ends them and removes what it wrote."""
    # a worker blocks on the FIFO: the pack is certainly under way when the signal comes
    proc, workers, _, _, out = _pack_with_a_stuck_worker(yolo_builder, tmp_path, stderr=subprocess.PIPE,
                                                         start_new_session=True)
    try:
        os.killpg(proc.pid, signal.SIGINT)   # as the terminal sends it
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert err.strip().splitlines()[-1] == "fastfeed: error: interrupted; nothing was left half-written", err
        assert not wait_gone(workers, 5.0) and not out.exists() and _siblings(out) == []
    finally:
        kill_all([proc, *running(workers)])
        proc.wait()


# --- a full disk --------------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (needs root, as `mount` does); unmounted afterwards."""
    d = tmp_path / "small"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_is_named_and_the_partial_store_removed(coco_builder, small_disk, workers):
    src = _noise_images(coco_builder, 60)       # ~6 MB of records for a 4 MiB disk
    out = small_disk / "out.ff"
    with pytest.raises(PackError) as e:
        run_pack(src, out, workers=workers)
    msg = str(e.value)
    assert f"the disk holding {small_disk} is full" in msg and "the pack needs about" in msg
    assert "Free space there, or pack onto a disk with room" in msg and "the partial store was removed" in msg
    assert e.value.report is not None
    assert sorted(os.listdir(small_disk)) == []   # no store, no half-written temporary, no lock


def test_a_full_disk_under_force_keeps_the_old_store(coco_builder, small_disk):
    src = _noise_images(coco_builder, 3)
    out = small_disk / "out.ff"
    run_pack(src, out)
    old = Store(out).fingerprint
    for k in range(3, 60):
        coco_builder.add_image(f"{k:03d}.jpg", 240, 320, data=jpeg_bytes(
            np.random.default_rng(k).integers(0, 255, (240, 320, 3), dtype=np.uint8), 95))
    with pytest.raises(PackError, match=f"is full .*{out} is as it was"):
        run_pack(coco_builder.write(), out, overwrite=True)
    assert Store(out).fingerprint == old and sorted(os.listdir(small_disk)) == ["out.ff"]


def test_no_space_reported_by_the_os_is_named_without_a_small_disk(coco_builder, tmp_path, monkeypatch):
    """Where no tmpfs can be mounted: ENOSPC from a write, as a full disk reports it."""
    from fastfeed.pack import writer

    src = _noise_images(coco_builder, 4)
    real, calls = writer.ShardWriter.append, {"n": 0}

    def append(self, record):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, record)

    monkeypatch.setattr(writer.ShardWriter, "append", append)
    with pytest.raises(PackError, match=f"the disk holding {tmp_path} is full \\(no space left"):
        run_pack(src, tmp_path / "out.ff")
    assert _siblings(tmp_path / "out.ff") == [] and not (tmp_path / "out.ff").exists()


def test_other_write_errors_are_not_called_a_full_disk(coco_builder, tmp_path, monkeypatch):
    from fastfeed.pack import writer

    src = _noise_images(coco_builder, 2)

    def append(self, record):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(writer.ShardWriter, "append", append)
    with pytest.raises(OSError, match="Input/output error"):   # plenty of space left: not "full"
        run_pack(src, tmp_path / "out.ff")
    assert _siblings(tmp_path / "out.ff") == []


# --- killed between the steps of a --force publish ----------------------------------------------------------

# Packs SRC into OUT with --force, killing itself at one step of the publish. argv: src, out, step.
KILLED_PUBLISH = """
import os, signal, sys
from fastfeed.store import publish
from fastfeed.pack import PackConfig, pack
src, out, step = sys.argv[1:4]
def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if step == "after-swap":            # the swap done, the old store not yet removed
    exchange = publish._exchange
    publish._exchange = lambda a, b: exchange(a, b) and die()
else:                               # no atomic swap here: killed between the two renames
    publish._exchange = lambda a, b: False
    real = os.rename
    def rename(a, b):
        real(a, b)
        if ".old-" in str(b):
            die()
    publish.os.rename = rename
pack(PackConfig(src=src, out=out, overwrite=True, workers=1, progress=False))
"""


def _kill_during_publish(coco_builder, tmp_path, step):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    out = tmp_path / "out.ff"
    old = run_pack(coco_builder.write(), out).manifest.fingerprint
    coco_builder.add_image("b.jpg", seed=1, boxes=[(1, [2, 2, 6, 6])])
    proc = start_script(KILLED_PUBLISH, coco_builder.write(), out, step)
    assert proc.wait(120) == -signal.SIGKILL
    return out, old


@pytest.mark.parametrize("reader", ["Store", "pack"])
def test_killed_between_the_two_renames_the_old_store_is_put_back(coco_builder, tmp_path, reader):
    out, old = _kill_during_publish(coco_builder, tmp_path, "between-renames")
    assert not out.exists() and any(".old-" in n for n in _siblings(out))   # what the kill left
    if reader == "Store":
        assert Store(out).fingerprint == old and len(Store(out)) == 1
    else:
        assert len(Store(run_pack(coco_builder.write(), out, overwrite=True).out)) == 2
    assert _siblings(out) == []


def test_killed_after_the_atomic_swap_the_new_store_is_in_place(coco_builder, tmp_path):
    probe_a, probe_b = tmp_path / "probe-a", tmp_path / "probe-b"
    probe_a.mkdir()
    probe_b.mkdir()
    if not publish._exchange(probe_a, probe_b):
        pytest.skip("this file system has no atomic exchange (renameat2 RENAME_EXCHANGE)")
    probe_a.rmdir()
    probe_b.rmdir()
    out, old = _kill_during_publish(coco_builder, tmp_path, "after-swap")
    assert len(Store(out)) == 2 and Store(out).fingerprint != old   # at every instant OUT was a store
    assert _siblings(out) == []


def test_exchange_swaps_two_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "x").write_text("b")
    if not publish._exchange(a, b):
        pytest.skip("no renameat2 RENAME_EXCHANGE here")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


def test_a_leftover_old_store_is_never_removed_while_out_is_not_a_store(tmp_path):
    out = tmp_path / "out.ff"
    out.mkdir()
    (out / "rejects.jsonl").write_text("")
    old = tmp_path / ".out.ff.old-12345"
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    junk = tmp_path / ".out.ff.incomplete-12345"
    junk.mkdir()
    with publish.locked(out):
        done = publish.recover(out)
    assert old.is_dir() and not junk.exists() and any("kept" in line for line in done)
