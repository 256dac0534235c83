"""A shard truncated under a second process's read names the shard: a forked child whose SIGBUS handler was
replaced since (a torch DataLoader worker installs one that blames shared memory), and a process reading a store
at a URL (the shard is the node's cached copy). Each process is started here and killed by its pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from loader_checks import make_painted_store
from proc_checks import read_line, start_script

CAUSE = "the store changed under the reader"

FORKED = """
import os, sys
import torch
from fastfeed import Store
store = Store(sys.argv[1])
store.record(0)                                  # the parent reads first: its handler is installed here
pid = os.fork()
if pid == 0:
    torch._C._set_worker_signal_handlers()       # what every torch DataLoader worker does first
    r = Store(sys.argv[1]).record(1)             # its payload is a view of the shard's map
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    bytes(r.payload)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), flush=True)
"""


def _kill(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_forked_child_whose_handler_was_replaced_names_the_shard(tmp_path):
    store = make_painted_store(tmp_path, store="original")
    proc = start_script(FORKED, store.path, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    child = None
    try:
        child = int(read_line(proc))
        shard = store.path / store.shards[store.shard_of(1)].file
        os.truncate(shard, 0)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert int(read_line(proc)) == -signal.SIGBUS   # the child still dies as it would have
        err = proc.stderr.read()
    finally:
        _kill(*([child] if child else []), proc.pid)
        proc.wait(timeout=30)
    assert f"fastfeed: bus error in pid {child}" in err and CAUSE in err and str(shard) in err


REMOTE = """
import sys
from fastfeed import Store
from fastfeed.store.format import record_key
store = Store(sys.argv[1], shard_cache=sys.argv[2])
store.record(0)
h = store.provider.handle(0)
view = h.txn.get(record_key(0))                  # a read in progress: a view of the cached shard's map
print(store.cache.file(store.shards[0]), flush=True)
sys.stdin.readline()
bytes(view)
"""


def test_a_process_reading_a_url_store_names_the_cached_shard(s3, remote_env, tmp_path):
    from s3_helpers import upload_dir

    store = make_painted_store(tmp_path, store="original")
    url = f"s3://{s3.bucket()}/s.ff"
    upload_dir(store.path, url)
    proc = start_script(REMOTE, url, tmp_path / "cache", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cached = read_line(proc)
        os.truncate(cached, 0)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=60)
    finally:
        _kill(proc.pid)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGBUS
    assert f"fastfeed: bus error in pid {proc.pid}" in err and CAUSE in err and f"shard {cached} is now 0 bytes" in err

