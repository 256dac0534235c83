"""A pack into s3:// stages its shards locally in a known place, `<temp>/fastfeed-url-packs/staging/pack-PID-*`:
what a pack killed with SIGKILL left there is removed by the next pack, once that pid runs no more; a running
pack's folder is never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest
from proc_checks import descendants, kill_all, running, start_script, wait_gone

from fastfeed.cli import main


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """The system temp folder of this test (and of the processes it starts): its own, so other packs don't mix in."""
    d = tmp_path / "temp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _source(yolo_builder, n: int = 40):
    yolo = yolo_builder()
    for k in range(n):
        yolo.add(f"{k:02d}", ["0 0.5 0.5 0.2 0.2"], seed=k)
    return yolo.root


def test_a_pack_to_s3_killed_mid_way_leaves_staging_the_next_pack_removes(s3, yolo_builder, temp):
    src = _source(yolo_builder)
    stuck = src / "images" / "train" / "20.jpg"
    stuck.unlink()
    os.mkfifo(stuck)   # reading it blocks until someone writes: the pack stays mid-way, its staging folder in use
    url = f"s3://{s3.bucket()}/out.ff"
    staging = temp / "fastfeed-url-packs" / "staging"
    proc = start_script("import sys; from fastfeed.cli import main; sys.exit(main(sys.argv[1:]))",
                        "pack", src, "-o", url, "--workers", "2", "--shards", "4", "--quiet",
                        env={"TMPDIR": str(temp)}, stdout=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while len(workers := descendants(proc.pid)) < 2 or not list(staging.glob(f"pack-{proc.pid}-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the pack never started staging"
            time.sleep(0.1)
        time.sleep(1.0)   # one worker is blocked on the FIFO; the other has written its shard or is writing it
        proc.kill()       # SIGKILL: no clean-up of its own
        proc.wait(30)
        assert not wait_gone(workers, 5.0)
        [left] = staging.glob(f"pack-{proc.pid}-*")      # what the killed pack left
        stuck.unlink()
        stuck.write_bytes((src / "images" / "train" / "21.jpg").read_bytes())
        again = subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(src), "-o", url, "--workers", "1",
                                "--quiet"], env=dict(os.environ, TMPDIR=str(temp)), capture_output=True, text=True,
                               timeout=300)   # the next pack on this machine
        assert again.returncode == 0, again.stderr
        assert f"fastfeed: warning: removed {left}, left by a pack (pid {proc.pid}) that was killed" in again.stderr
        assert not left.exists() and list(staging.iterdir()) == []       # its own folder went with it too
    finally:
        kill_all([proc, *running(workers)])
        proc.wait()


def test_a_running_pack_keeps_its_staging_folder(s3, sample_dir, temp, caplog):
    staging = temp / "fastfeed-url-packs" / "staging"
    staging.mkdir(parents=True)
    ended = subprocess.Popen(["true"])
    ended.wait()
    live = subprocess.Popen(["sleep", "120"])   # stands in for another pack running on this machine
    try:
        dead_dir, live_dir = staging / f"pack-{ended.pid}-x1", staging / f"source-{live.pid}-x2"
        for d in (dead_dir, live_dir):
            d.mkdir()
            (d / "shard-00000.mdb").write_bytes(b"\0" * 4096)
        (staging / "not-a-pack").mkdir()   # not named as a pack names its folders: none of the pack's business
        assert main(["pack", str(sample_dir), "-o", f"s3://{s3.bucket()}/s.ff", "--workers", "1"]) == 0
        assert f"removed {dead_dir}, left by a pack (pid {ended.pid}) that was killed" in caplog.text
        assert sorted(p.name for p in staging.iterdir()) == sorted([live_dir.name, "not-a-pack"])
        assert (live_dir / "shard-00000.mdb").stat().st_size == 4096
    finally:
        live.kill()
        live.wait()
