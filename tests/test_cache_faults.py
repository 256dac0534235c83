"""The shm cache's faults as a user meets them: its filesystem full during the build (a named error with the size
and what to do, nothing left behind), and a slab whose loader was killed with SIGKILL (reclaimed by the next
`fastfeed cache ls` or cache open, and said so)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from cache_helpers import painted_store, shm_dir  # noqa: F401  (fixtures)
from proc_checks import read_line, start_script

from fastfeed.cache import acquire, build, layout
from fastfeed.cache.layout import users_path
from fastfeed.cli import main


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """tiny_tmpfs(options) -> a folder with a tmpfs of its own mounted there (root; skipped where refused)."""
    mounted = []

    def make(options: str):
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)], capture_output=True).returncode:
            pytest.skip("cannot mount a small tmpfs here (not root?)")
        mounted.append(disk)
        return disk

    yield make
    for disk in mounted:
        subprocess.run(["umount", str(disk)], check=True)


def _slab_bytes(store, imgsz: int) -> int:
    shapes, counts, _, _ = build.scan(store, imgsz)
    return int(layout.slab_bytes(shapes, counts)[len(store)])


def test_a_cache_that_fills_its_filesystem_exactly_is_refused_by_name_and_leaves_nothing(painted_store, tiny_tmpfs,
                                                                                        capsys):
    """The slab fits the free space to the page; the users file then had no room (`OSError: [Errno 28]` after
    the build, the slab left behind). Its page is taken first now: the budget check says it does not fit."""
    disk = tiny_tmpfs("size=4m")
    need = _slab_bytes(painted_store, 64)
    st = os.statvfs(disk)
    (disk / "filler").write_bytes(b"x" * (st.f_bavail * st.f_frsize - (need + 4095) // 4096 * 4096))
    assert main(["cache", "build", str(painted_store.path), "--imgsz", "64", "--shm-dir", str(disk), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"the shm cache needs {need / 2**20:.1f} MiB ({need} bytes) at imgsz 64, but {disk} has" in err
    assert "Traceback" not in err and "Errno" not in err
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_a_filesystem_that_fills_during_the_build_names_it_the_size_and_what_to_do(painted_store, tiny_tmpfs, capsys):
    """Out of inodes (tmpfs says ENOSPC) when the slab's file is created."""
    disk = tiny_tmpfs("size=4m,nr_inodes=2")      # the folder and one file: the users file
    need = _slab_bytes(painted_store, 64)
    assert main(["cache", "build", str(painted_store.path), "--imgsz", "64", "--shm-dir", str(disk), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"the shm cache's filesystem {disk} filled up while the cache was built (No space left on device" in err
    assert f"the slab needs {need / 2**20:.1f} MiB ({need} bytes)" in err
    assert "the partial slab was removed" in err and f"remount,size=1G {disk}" in err and "Traceback" not in err
    assert list(disk.iterdir()) == []


def test_a_read_only_cache_folder_is_named_by_build_and_clear(painted_store, tiny_tmpfs, capsys):
    """Was `OSError: [Errno 30] Read-only file system` and a traceback (the users file is opened for writing)."""
    disk = tiny_tmpfs("size=4m")
    build = ["cache", "build", str(painted_store.path), "--imgsz", "64", "--shm-dir", str(disk), "--quiet"]
    assert main(build) == 0
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    for argv in (["cache", "clear", "--shm", "--shm-dir", str(disk)], [*build[:3], "--imgsz", "32", *build[5:]]):
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"the shm cache's folder {disk} is read-only here: give an existing, writable folder" in err
        assert "Traceback" not in err and "Errno" not in err
    assert len(list(disk.iterdir())) == 2      # the slab and its users file, untouched


ATTACH = """
import sys
from fastfeed import Store
from fastfeed.cache import acquire
lease = acquire(Store(sys.argv[1]), int(sys.argv[3]), sys.argv[2], progress=False)
print("attached", flush=True)
sys.stdin.readline()
"""


def _attach_and_kill(store, cache_dir, imgsz: int) -> int:
    proc = start_script(ATTACH, store.path, cache_dir, imgsz, stdin=subprocess.PIPE)
    try:
        assert read_line(proc) == "attached"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
    return proc.pid


def test_a_slab_whose_loader_was_killed_is_reclaimed_by_cache_ls_and_said_so(painted_store, shm_dir, capsys):
    with acquire(painted_store, 64, shm_dir, keep=True):      # kept: never reclaimed
        pass
    pid = _attach_and_kill(painted_store, shm_dir, 96)
    slab = layout.slab_path(shm_dir, painted_store.fingerprint, 96)
    assert slab.exists()                                   # SIGKILL: it never detached
    assert main(["cache", "ls", "--shm-dir", str(shm_dir), "--shm"]) == 0
    out = capsys.readouterr().out
    assert f"{slab.name}: every process that used it (pid {pid}) died without detaching: reclaimed" in out
    assert "reclaimed" in out
    assert not slab.exists() and not users_path(slab).exists()
    assert layout.slab_path(shm_dir, painted_store.fingerprint, 64).exists()
    assert main(["cache", "ls", "--shm-dir", str(shm_dir), "--shm"]) == 0
    assert "reclaimed" not in capsys.readouterr().out
    assert main(["cache", "clear", "--shm-dir", str(shm_dir), "--shm"]) == 0


def test_a_cache_open_reclaims_other_slabs_whose_users_died_and_reuses_its_own(painted_store, shm_dir, caplog):
    _attach_and_kill(painted_store, shm_dir, 96)
    with acquire(painted_store, 96, shm_dir) as lease:
        assert not lease.built                                # a restarted run gets its slab back
    assert "died without detaching" not in caplog.text
    _attach_and_kill(painted_store, shm_dir, 64)
    other = layout.slab_path(shm_dir, painted_store.fingerprint, 64)
    assert other.exists()
    with acquire(painted_store, 96, shm_dir):
        assert not other.exists() and not users_path(other).exists()
    assert f"the shm cache {other}: every process that used it" in caplog.text
