"""How a `DevicePrefetcher` runs its loader: `inline` (in the consumer's thread, `depth` batches queued on the
side stream) or `threaded` (a producer thread, THREAD_NAME, `depth` batches ahead through a bounded queue). Both
ask the loader for the next batch only after the last one's host memory has been read (the buffer-reuse hazard:
docs/design.md, 'The prefetcher copies on a side stream')."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque
from typing import NamedTuple

from ..batch import close

log = logging.getLogger(__name__)

THREAD_NAME = "fastfeed-device-prefetch"
_POLL = 0.05     # seconds between stop checks of a producer thread blocked on a full queue
_JOIN_S = 60.0   # how long close() waits for a producer thread stuck inside next(loader)


class _Failure(NamedTuple):
    error: BaseException


_END = object()


def inline(pf):
    """`pf`'s batches, produced in the consumer's thread with `pf.depth` in flight."""
    it, pending, last, error = iter(pf.loader), deque(), None, None

    def fetch() -> bool:
        nonlocal last, error
        pf.release_host(last)                     # the loader may reuse the last batch's memory from here
        try:
            batch = next(it, _END)
        except Exception as e:                  # raised once the batches before it are handed out
            error = e
            return False
        if batch is _END:
            return False
        last = pf.produce(batch)
        pending.append(last)
        return True

    try:
        more = True
        while more and len(pending) < pf.depth:
            more = fetch()
        while pending:
            item = pending.popleft()
            if more:
                more = fetch()                  # top up first: `depth` stay in flight while the consumer works
            yield pf.hand_out(item)
        if error is not None:
            raise error
    finally:
        pf.release_host(last)
        close(it)


def threaded(pf):
    """`pf`'s batches, produced by a THREAD_NAME thread `pf.depth` ahead."""
    it = iter(pf.loader)
    try:   # the first batch in the caller's thread: a loader that starts (forks) workers does it from here
        first = next(it, _END)
    except BaseException:
        close(it)
        raise
    q: queue.Queue = queue.Queue(maxsize=pf.depth)
    stop = threading.Event()
    worker = threading.Thread(target=_produce, args=(pf, it, first, q, stop), name=THREAD_NAME, daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error                # the loader's exception, its traceback included
            yield pf.hand_out(item)
    finally:
        stop.set()
        _drain(q)                               # a producer blocked on put() sees `stop` within _POLL
        worker.join(_JOIN_S)
        _drain(q)
        if worker.is_alive():
            log.warning("the %s thread is still inside next(loader) after %.0f s; left running", THREAD_NAME, _JOIN_S)


def _produce(pf, it, batch, q: queue.Queue, stop: threading.Event) -> None:
    def put(x) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                q.put(x, timeout=_POLL)
                return True
        return False

    last = None
    try:
        while batch is not _END and not stop.is_set():
            last = pf.produce(batch)
            if not put(last):
                return
            pf.release_host(last)                 # the loader may reuse the last batch's memory from here
            batch = next(it, _END)
        put(_END)
    except BaseException as e:  # noqa: B036  (everything reaches the consumer, even KeyboardInterrupt)
        put(_Failure(e))
    finally:
        try:
            pf.release_host(last)
        finally:
            close(it)


def _drain(q: queue.Queue) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            q.get_nowait()
