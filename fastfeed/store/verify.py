"""`verify`: re-check every record of a store; `summarize`: what a store holds, from its manifest."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import numpy as np

from .. import codec, tasks
from ..procs import worker_context
from ..progress import bar as progress_bar
from . import format as fmt
from .objstore import RemoteError, RemoteMissing
from .reader import Store
from .remote.errors import ShardDamaged

_CHUNK = 256
_RUN_VERIFY = re.compile(r"run `fastfeed verify[^`]*` and ")   # the readers' advice, left out of verify's own list


@dataclass
class VerifyResult:
    path: Path
    checked: int = 0
    decoded: int = 0
    damaged: list[dict] = field(default_factory=list)   # {shard, index, error}

    @property
    def ok(self) -> bool:
        return not self.damaged


def _not_the_data(e: BaseException) -> None:
    """Raise `e` again when it says nothing of the store's bytes: the node's shard cache without room, or the bucket
    unreachable (what stops the verify, named), not a damaged or missing object (what verify lists)."""
    if isinstance(e, RemoteError) and not isinstance(e, (ShardDamaged, RemoteMissing)):
        raise e


def _check_range(args) -> tuple[int, list[dict]]:
    store, start, stop, decode = args   # the Store, pickled: a store at a URL keeps its cache settings
    damaged = []
    for i in range(start, stop):
        shard = store.shard_name(i)
        try:
            r = store.record(i, check_crc=True)
            boxes = np.concatenate([r.boxes, r.crowd_boxes])
            if ((boxes < 0) | (boxes > 1)).any() or (boxes[:, 2:] < boxes[:, :2]).any():
                raise fmt.RecordCorrupt("boxes outside 0..1 or inverted")
            m = store.manifest   # the geometry: the store's task's, one entry per training box, inside the image
            if r.task != m.task:
                raise fmt.RecordCorrupt(f"holds {r.task} labels in a store of {m.task} labels")
            if problem := tasks.get(r.task).check_record(r.geometry, len(r.boxes), m):
                raise fmt.RecordCorrupt(problem)
            if decode and r.codec != "raw":
                img = r.decode()
                if img.shape[:2] != r.size:
                    raise fmt.RecordCorrupt(f"decoded {img.shape[1]}x{img.shape[0]}, header says {r.width}x{r.height}")
        except (fmt.FormatError, codec.DecodeError, lmdb.Error) as e:
            _not_the_data(e)
            damaged.append({"shard": shard, "index": i, "error": _RUN_VERIFY.sub("", str(e))})
    store.close()
    return stop - start, damaged


def _check_shards(store: Store, changed: list) -> list[dict]:
    """Shard files present, of the checksum the manifest gives, holding exactly the records it says. A store at a
    URL: what is in the bucket, not what the node's shard cache holds: each shard downloaded afresh into the cache
    (replacing the cached copy), its size and sha256 checked. A local shard whose sha256 differs goes into `changed`
    (its records are still checked, to name the damaged ones)."""
    damaged = [{"shard": s.file, "index": None, "error": f"shard file {s.file} is missing (records {s.start}.."
                                                          f"{s.start + s.count - 1})"} for s in store.missing()]
    if damaged:
        return damaged
    for k, s in enumerate(store.shards):
        try:
            if (differs := store.check_source(k)) is not None:
                changed.append({"shard": s.file, "index": None, "error": differs})
            entries = store.shard_entries(k)
        except ShardDamaged as e:   # the bucket's object: the others are still checked
            damaged.append({"shard": s.file, "index": None, "error": _RUN_VERIFY.sub("", str(e))})
            continue
        except fmt.FormatError as e:
            _not_the_data(e)
            return [{"shard": s.file, "index": None, "error": str(e)}]
        if entries != s.count:
            damaged.append({"shard": s.file, "index": None,
                            "error": f"holds {entries} records, manifest says {s.count}"})
    return damaged


def verify(path, decode: bool = False, workers: int = 1, progress: bool = True, options=None) -> VerifyResult:
    """Check every record's CRC and layout (and with `decode`, that its image decodes). `options`: the
    `StoreOptions` of a store at a URL."""
    store = Store(path, options=options)
    result = VerifyResult(store.path)
    changed: list[dict] = []
    result.damaged = _check_shards(store, changed)
    store.close()
    if result.damaged:
        return result  # records cannot be trusted to be where the manifest says
    n = len(store)
    store.check_crc = False   # pickled into the workers with its options (a store at a URL: its shard cache)
    jobs = [(store, a, min(a + _CHUNK, n), decode) for a in range(0, n, _CHUNK)]
    pool = None
    if workers > 1 and len(jobs) > 1:
        with worker_context() as ctx:
            pool = ctx.Pool(workers)
    with progress_bar(progress=progress, total=n, unit="rec", desc="verify") as bar, pool or contextlib.nullcontext():
        for count, damaged in (pool.imap if pool else map)(_check_range, jobs):
            result.damaged += damaged
            bar.update(count)
    named = {d["shard"] for d in result.damaged}
    result.damaged += [c for c in changed if c["shard"] not in named]   # changed, but no record says where
    result.checked, result.decoded = n, n if decode else 0
    return result


_BUCKETS = (256, 512, 640, 1024, 2048)


def task_summary(m: fmt.Manifest) -> dict:
    """What a store's records hold besides boxes: the task, the pose set's kpt_shape and flip_idx, and the counts
    the pack took (`stats.geometry`; a store of format version 3 or older: detect, nothing more)."""
    counts = dict(m.stats.get("geometry") or {})
    return {"name": m.task, **counts, **tasks.get(m.task).summary(counts, m)}


def summarize(path, options=None) -> dict:
    """Counts, classes with box counts, image size histogram and bytes, for `fastfeed inspect`."""
    store = Store(path, options=options)
    m = store.manifest
    hist = {f"<= {b}": 0 for b in _BUCKETS} | {f"> {_BUCKETS[-1]}": 0}
    for size, count in m.stats["sizes"].items():
        long_side = max(int(v) for v in size.split("x"))
        key = next((f"<= {b}" for b in _BUCKETS if long_side <= b), f"> {_BUCKETS[-1]}")
        hist[key] += count
    return {
        "path": str(store.path), "format_version": m.format_version, "created": m.created,
        "images": m.num_images, "boxes": m.num_boxes, "crowd_boxes": m.num_crowd,
        "classes": [{"id": i, "name": n, "source_id": sid, "boxes": b}
                    for i, (n, sid, b) in enumerate(zip(m.classes, m.category_ids, m.stats["class_boxes"]))],
        "payload": m.payload, "shards": len(m.shards), "bytes": store.stored_bytes(),
        "record_bytes": m.stats["record_bytes"],
        "long_side_histogram": hist, "common_sizes": dict(list(m.stats["sizes"].items())[:5]),
        "source": m.source, "report": m.report, "fingerprint": m.fingerprint, "task": task_summary(m),
    }
