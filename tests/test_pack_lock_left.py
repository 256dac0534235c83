"""The pack lock `.OUT.lock` goes with the pack that made it, even when the pack could not start: a disk that is
already full refuses the pid the lock file holds, and the file is then removed, not left empty beside OUT."""

from __future__ import annotations

import os
import subprocess

import pytest

from fastfeed import Store
from fastfeed.cli import main


@pytest.fixture
def full_disk(tmp_path):
    """A 4 MiB tmpfs filled to the last byte (needs root, as `mount` does); unmounted afterwards."""
    d = tmp_path / "full"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        with open(d / "fill", "wb") as f, pytest.raises(OSError):   # ENOSPC: the disk is full
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_pack_onto_a_full_disk_leaves_no_lock(full_disk, capsys):
    out = full_disk / "out.ff"
    assert main(["pack", "-o", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write beside {out}: [Errno 28] No space left on device" in err
    assert sorted(os.listdir(full_disk)) == ["fill"]      # no `.out.ff.lock`, empty or not
    (full_disk / "fill").unlink()                         # room again: the next pack just runs
    assert main(["pack", "-o", str(out), "--quiet"]) == 0
    assert len(Store(out)) == 16 and sorted(os.listdir(full_disk)) == ["out.ff"]


def test_an_empty_lock_left_by_an_older_run_trips_nobody(tmp_path, capsys):
    out = tmp_path / "out.ff"
    lock = tmp_path / ".out.ff.lock"
    lock.touch()                                          # what a pack onto a full disk used to leave
    assert main(["pack", "-o", str(out), "--quiet"]) == 0
    assert not lock.exists()
    lock.touch()
    assert main(["verify", str(out), "--quiet"]) == 0     # a reader opening OUT tidies it away too
    assert not lock.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out.ff"]
