"""A shard truncated under its readers is named, with the cause (the store changed under the reader): through
the cpu loader's workers, without workers, and when the change lands in the middle of a read (SIGBUS)."""

from __future__ import annotations

import os
import signal

import pytest
from loader_checks import make_painted_store
from proc_checks import start_script

from fastfeed.loaders import LoaderConfig, WorkerError, create_loader
from fastfeed.loaders.workers import exit_reason

CAUSE = "the store changed under the reader"


@pytest.fixture
def store(tmp_path):
    return make_painted_store(tmp_path, store="original")   # a store of its own: the test damages it


def _truncate(store, shard: int = 0) -> str:
    path = store.path / store.shards[shard].file
    os.truncate(path, path.stat().st_size // 2)
    return str(path)


def test_with_workers_the_worker_error_names_the_shard_and_the_cause(store):
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2)
    with create_loader("cpu", store, cfg) as loader:
        it = iter(loader)
        next(it)
        shard = _truncate(store)
        with pytest.raises(WorkerError) as e:
            for _ in range(100):
                next(it)
    # Either a read saw the shard shrink (StoreChanged in the worker's traceback: at its first open or after), or the change landed
    # mid-read and the worker died of SIGBUS: both say which shard and why, not "out of memory?".
    assert CAUSE in str(e.value) and shard in str(e.value) and "out of memory" not in str(e.value)


def test_a_shard_truncated_after_the_store_was_opened_is_named_as_changed_at_the_first_read(store):
    """A process whose first read comes after the change (a worker that had not read yet) says the same as one that
    was reading: the shard changed under the store's readers; a store already truncated when opened says so."""
    from fastfeed import Store
    from fastfeed.store import FormatError, StoreChanged

    opened = Store(store.path)                      # sound when opened, nothing read yet
    shard = _truncate(store)
    with pytest.raises(StoreChanged, match="the store changed under the reader") as e:
        opened[0]
    assert shard in str(e.value) and "when packed" in str(e.value)
    with pytest.raises(FormatError, match="truncated or replaced") as e:
        Store(store.path)[0]                        # opened truncated: not a change under a reader
    assert not isinstance(e.value, StoreChanged)


WITHOUT_WORKERS = """
import os, sys
from fastfeed import Store
from fastfeed.store import StoreChanged
from fastfeed.loaders import LoaderConfig, create_loader
store = Store(sys.argv[1])
loader = create_loader("cpu", store, LoaderConfig(imgsz=64, batch_size=4, workers=0))
it = iter(loader)
next(it)
path = store.path / store.shards[0].file
os.truncate(path, path.stat().st_size // 2)
try:
    for _ in range(100):
        next(it)
except StoreChanged as e:
    print(e, flush=True)
"""


def test_without_workers_the_error_names_the_shard_not_a_bus_error(store):
    proc = start_script(WITHOUT_WORKERS, store.path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"exit code {proc.returncode} (-7: the bus error this check exists for)"
    assert CAUSE in out and str(store.path / store.shards[0].file) in out and "when packed" in out


MID_READ = """
import os, sys
from fastfeed import Store
store = Store(sys.argv[1])
r = store.record(0)          # its payload is a view of the shard's map
os.truncate(store.path / store.shards[0].file, 0)
bytes(r.payload)             # the page is gone: SIGBUS
"""


def test_a_change_in_the_middle_of_a_read_is_named_before_the_bus_error(store):
    proc = start_script(MID_READ, store.path, stdout=None, stderr=-1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGBUS     # it still dies as it would have: the fault is not survivable
    assert "fastfeed: bus error" in err and CAUSE in err and str(store.path / store.shards[0].file) in err


def test_a_worker_killed_by_a_bus_error_is_named_by_the_shard_that_changed(store):
    """The parent's side of a worker's SIGBUS (its exit code -7): the reason names what changed, not memory.
    (Sending a worker SIGBUS would test the signal's delivery, not this: a real one comes from a read.)"""
    shard = _truncate(store)
    assert CAUSE in exit_reason(-signal.SIGBUS) and shard in exit_reason(-signal.SIGBUS)
    assert "out of memory" in exit_reason(-signal.SIGKILL) and exit_reason(0) == ""


def test_a_shard_both_opened_and_mapped_is_named_once_in_the_packed_wording(store):
    """The SIGBUS handler's list: a truncated shard that a Store holds and this process maps is named once, in the
    same words as the read's error (one wording for both: changed.resized)."""
    from fastfeed import Store
    from fastfeed.store.changed import changed_shards

    opened = Store(store.path)
    opened[0]                                       # mapped: this process's handles see it too
    packed = store.shards[0].bytes
    shard = _truncate(store)
    assert [c for c in changed_shards() if shard in c] == [f"shard {shard} is now {packed // 2} bytes, {packed} when packed"]
