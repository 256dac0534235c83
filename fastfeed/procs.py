"""Starting worker processes safely: fork, with OpenCV's thread pool parked while children start.

Fork is the fast way to start workers (nothing to re-import, the parent's objects are inherited,
no `if __name__ == "__main__"` needed), but OpenCV's thread pool does not survive it: a child that
calls a parallel OpenCV function after the parent used the pool waits forever for threads that
were never copied (the well-known OpenCV-in-DataLoader deadlock). Shrinking the pool to one thread
around the fork leaves the children single-threaded — what a worker per core wants anyway — and
the parent gets its threads back afterwards. Where fork does not exist, spawn is used.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from contextlib import contextmanager


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask; a container's CPU set), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def worker_context():
    """Yield a multiprocessing context; start every process inside the `with` block."""
    if "fork" not in mp.get_all_start_methods():
        yield mp.get_context("spawn")
        return
    import cv2

    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield mp.get_context("fork")
    finally:
        cv2.setNumThreads(threads)
