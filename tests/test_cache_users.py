"""The shm cache's reference counting, cleanup, and the fastfeed cache command line."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from cache_helpers import (  # noqa: F401  (fixtures)
    dead_pid,
    jpeg_store,
    new_in_dev_shm,
    own_painted_store,
    painted_store,
    shm_dir,
)

from fastfeed.cache import acquire, clear_caches, layout, list_caches, users
from fastfeed.cache.layout import users_path
from fastfeed.cli import main

# --- reference counting and cleanup --------------------------------------------------------------

def test_the_last_user_out_removes_the_slab_and_dead_users_are_pruned(painted_store, shm_dir):
    a = acquire(painted_store, 96, shm_dir)
    b = acquire(painted_store, 96, shm_dir)
    assert a.built and not b.built and a.path == b.path
    with open(users_path(a.path), "a") as f:
        f.write(f"{dead_pid()} 12345.0\n")                 # a user that crashed
    a.release()
    a.release()                                            # idempotent
    assert a.path.exists()
    assert users.read_path(users_path(a.path)).entries == [(os.getpid(), pytest.approx(users.start_time(os.getpid())))]
    b.release()
    assert not list(shm_dir.iterdir())


def test_keep_leaves_the_slab_for_the_next_run(painted_store, shm_dir):
    with acquire(painted_store, 96, shm_dir, keep=True) as lease:
        pass
    assert lease.path.exists()
    with acquire(painted_store, 96, shm_dir) as again:
        assert not again.built
    (info,) = list_caches(shm_dir)
    assert info.state == "complete" and info.keep and info.users == []
    removed, kept = clear_caches(shm_dir)
    assert [r.path for r in removed] == [lease.path] and not kept


def test_cleanup_leaves_dev_shm_as_it_was(own_painted_store):
    """The default cache_dir itself: nothing of ours is left in /dev/shm once the user is gone."""
    before = set(os.listdir("/dev/shm"))
    lease = acquire(own_painted_store, 96)
    during = set(os.listdir("/dev/shm")) - before
    assert {lease.path.name, lease.path.name + ".users"} <= during
    lease.release()
    assert not new_in_dev_shm(own_painted_store, before)
    assert not lease.path.exists()


def test_the_lock_follows_a_file_removed_while_waiting(tmp_path):
    path = tmp_path / "x.users"
    got = []
    with users.locked(path, 5):
        def waiter():
            with users.locked(path, 5) as fd2:
                got.append(os.fstat(fd2).st_ino == os.stat(path).st_ino)
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)
        path.unlink()          # as release() does, still holding the lock
    t.join(10)
    assert got == [True]       # the waiter locked the new file, not the removed one


# --- the command line ----------------------------------------------------------------------------

def test_cli_cache_build_ls_clear(painted_store, jpeg_store, shm_dir, capsys):
    d = str(shm_dir)
    assert main(["cache", "ls", "--shm-dir", d]) == 0
    assert "no fastfeed caches" in capsys.readouterr().out
    assert main(["cache", "build", str(jpeg_store.path), "--imgsz", "128", "--shm-dir", d, "--quiet"]) == 0
    assert "built, 16/16 images" in capsys.readouterr().out
    held = acquire(painted_store, 96, shm_dir)                # in use by this process
    assert main(["cache", "ls", "--shm-dir", d]) == 0
    out = capsys.readouterr().out
    assert "2 fastfeed cache(s)" in out
    for fp, imgsz, images, who in ((jpeg_store.fingerprint, "128", "16/16", "0, keep"),
                                   (painted_store.fingerprint, "96", "24/24", f"1 (pid {os.getpid()})")):
        line = next(x for x in out.splitlines() if fp in x and x.strip().startswith("fastfeed-"))
        assert f" {imgsz} " in line and images in line and "complete" in line and who in line and "KiB" in line
    assert main(["cache", "ls", "--shm-dir", d, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(e["fingerprint"], e["imgsz"], e["bytes"] > 0) for e in listed} == {
        (jpeg_store.fingerprint, 128, True), (painted_store.fingerprint, 96, True)}

    assert main(["cache", "clear", "--shm-dir", d]) == 0
    out = capsys.readouterr().out
    assert f"removed {d}/fastfeed-{jpeg_store.fingerprint}-128" in out
    assert f"in use by pid(s) {os.getpid()}" in out and "1 removed" in out and "1 kept" in out
    assert held.path.exists()
    assert main(["cache", "clear", "--shm-dir", d, "--force"]) == 0
    assert "1 removed" in capsys.readouterr().out and not held.path.exists()
    held.release()                                        # nothing left to remove; leaves the folder empty
    assert main(["cache", "ls", "--shm-dir", str(shm_dir / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["cache"]) == 2


def test_cli_clear_removes_leftovers_of_crashed_builds(painted_store, shm_dir, capsys):
    slab = layout.slab_path(shm_dir, painted_store.fingerprint, 96)
    layout.temp_path(slab, dead_pid()).write_bytes(b"half")
    users_path(slab).write_text(f"{dead_pid()} 1.0\n")
    (info,) = list_caches(shm_dir)
    assert info.state == "stale" and "left half-written by pid" in info.note
    assert main(["cache", "clear", "--shm-dir", str(shm_dir)]) == 0
    assert "1 removed" in capsys.readouterr().out
