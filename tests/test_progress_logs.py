"""A command's progress in a log file (`make demo > log 2>&1`): plain lines, never the carriage returns a bar
redraws itself with. Each command runs as a user runs it, stderr a file (not a terminal)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(args, cwd, log):
    with open(log, "wb") as f:
        p = subprocess.run([sys.executable, "-m", "fastfeed", *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                           timeout=300)
    return p.returncode, log.read_bytes()


@pytest.mark.slow   # ~6 s: three commands in subprocesses
def test_pack_verify_and_cache_build_write_no_carriage_returns_into_a_log(tmp_path):
    store = tmp_path / "sample.ff"
    for i, args in enumerate([["pack", "-o", str(store), "--workers", "1"],
                              ["verify", str(store), "--decode"],
                              ["cache", "build", str(store), "--imgsz", "64", "--shm-dir", str(tmp_path)],
                              ["cache", "clear", "--shm", "--shm-dir", str(tmp_path), "--force"]]):
        rc, out = _run(args, tmp_path, tmp_path / f"log{i}")
        assert rc == 0, out.decode()
        assert out and b"\r" not in out, (args, out[:300])
