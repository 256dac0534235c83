"""`pack()`: read a COCO/YOLO dataset, check every image and box in parallel, write a store."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..procs import usable_cores, worker_context
from ..progress import bar as progress_bar
from ..store import format as fmt
from ..store import urls
from ..store.publish import publish, temp_dir_for
from . import part, remote
from .config import PackConfig
from .layout import open_source
from .process import raw_annotation_verdict
from .report import PackReport
from .source import PackError
from .usable import check_coco_units, check_dropped, check_kept, check_labelled, resolve_task, unlabelled_share
from .writer import DiskSpace, build_manifest, pack_lock

log = logging.getLogger(__name__)


@dataclass
class PackResult:
    out: Path
    manifest: fmt.Manifest
    report: PackReport
    seconds: float = 0.0
    source_desc: str = ""
    rejects: Path | None = None     # OUT/rejects.jsonl


def _check_out(cfg: PackConfig) -> bool:
    """Whether OUT is to be replaced; raises when it may not be (called under the pack lock)."""
    out = cfg.out
    if not out.exists():
        return False
    if out.is_dir() and os.listdir(out) == [fmt.REJECTS]:
        return True  # what a pack that rejected every image leaves: replaced without --force
    if not cfg.overwrite:
        raise PackError(f"{out} already exists; pass --force to replace it (it is replaced only once the new store is complete)")
    if out.is_dir() and not (out / fmt.MANIFEST).is_file() and any(out.iterdir()):
        raise PackError(f"refusing to replace {out}: it is a non-empty folder that is not a fastfeed store")
    if not out.is_dir():
        raise PackError(f"refusing to replace {out}: it is a file, not a fastfeed store")
    return True


def _run_parts(jobs: list[part.PartJob], workers: int, progress: bool, total: int):
    """Run every job; yield results in part order. Stops early on a --on-error fail result."""
    with progress_bar(progress=progress, total=total, unit="img", desc="pack") as bar:
        with worker_context() as ctx:
            counter, abort = ctx.Value("q", 0), ctx.Event()
            workers = min(workers, len(jobs))   # a process per part at most (--workers 1000 on 30 images: one part)
            pool = ctx.Pool(workers, part.init, (counter, abort)) if workers > 1 else None
        if pool is None:
            part.init(counter, abort)
            for job in jobs:
                res = part.run(job)
                bar.update(counter.value - bar.n)
                yield res
            return
        with pool:
            pending = pool.imap(part.run, jobs)
            for _ in jobs:
                while True:
                    try:
                        res = pending.next(timeout=0.25)
                        break
                    except mp.TimeoutError:
                        bar.update(counter.value - bar.n)
                bar.update(counter.value - bar.n)
                if res.failed is not None:
                    abort.set()   # other workers stop at their next image
                yield res


def _open(cfg: PackConfig, src) -> tuple:
    """(the Source, a PackReport holding its layout problems); raises PackError for what stops a pack."""
    source = open_source(src, cfg.format, cfg.split, cfg.ann, cfg.images, cfg.names, cfg.task)
    report = PackReport()
    report.extend(source.problems)
    source.task = resolve_task(cfg.task, source, report)
    if not source.items and not report.errors:
        raise PackError(f"no images found: {source.describe()}")
    try:
        check_coco_units(source, cfg.coco_boxes)
        if not cfg.allow_background_only:
            check_labelled(source)
    except PackError as e:
        raise PackError(str(e), report) from None
    if cfg.on_error == "fail" and report.errors:
        raise PackError(f"--on-error fail: {report.errors[0].describe()}")
    if (warning := unlabelled_share(source)) is not None:
        log.warning("%s", warning)
    log.info("packing %s", source.describe())
    return source, report


def pack(cfg: PackConfig) -> PackResult:
    """Pack `cfg.src` into `cfg.out` (either may be a URL: pack/remote.py). Raises PackError (with `.report` when
    packing started, and `.rejects`, the file listing every rejection, when it was written)."""
    with contextlib.ExitStack() as stack:
        src, files = cfg.src, None
        if urls.is_url(cfg.src):   # the layout readers read a local stand-in; the images come from the bucket
            src, files = stack.enter_context(remote.staged(cfg.src, cfg.storage_options))
        try:
            res = (_pack_to_url if urls.is_url(cfg.out) else _pack_local)(cfg, src, files)
        except PackError as e:
            if files is not None:   # what it says of the stand-in, said of the bucket
                e.args = (files.shown(str(e)),)
            raise
        if files is not None:
            res.source_desc = files.shown(res.source_desc)
        return res


def _pack_local(cfg: PackConfig, src, files) -> PackResult:
    t0 = time.perf_counter()
    if not cfg.out.parent.is_dir():
        what = "is a file, not a folder" if cfg.out.parent.exists() else "does not exist"
        raise PackError(f"cannot write {cfg.out}: its parent folder {cfg.out.parent} {what}")
    with pack_lock(cfg.out):  # before any work: a second pack into OUT stops here
        replace = _check_out(cfg)
        source, report = _open(cfg, src)
        tmp = temp_dir_for(cfg.out)
        shutil.rmtree(tmp, ignore_errors=True)
        space = DiskSpace.at(cfg.out.parent)
        try:
            tmp.mkdir()
            manifest = _pack_into(tmp, cfg, source, report, files) if source.items else None
            report.write_rejects(tmp / fmt.REJECTS)
            if manifest is None:
                _keep_rejects(tmp, cfg.out, report, len(source.items))
            fmt.write_manifest(tmp / fmt.MANIFEST, manifest)  # last: a store without it is not a store
            publish(tmp, cfg.out, replace)
        except BaseException as e:
            full = space.full_error(e, tmp, cfg.out, replace, part.estimated_bytes(source.items, cfg))
            shutil.rmtree(tmp, ignore_errors=True)
            if full is not None:
                raise PackError(full, report) from e
            raise
    return PackResult(cfg.out, manifest, report, time.perf_counter() - t0, source.describe(), cfg.out / fmt.REJECTS)


def _pack_into(tmp: Path, cfg: PackConfig, source, report: PackReport, files=None, name=fmt.shard_file,
               sink=None) -> fmt.Manifest | None:
    """Write the shards into `tmp`, numbered as they complete (in order: `name(k)`) and each handed to
    `sink(path, name)` when given (an upload); returns the manifest, or None when every image was rejected."""
    workers = cfg.workers if cfg.workers is not None else usable_cores()
    nc = len(source.class_names) or None
    jobs = [part.PartJob(k, items, cfg, source.task, nc, tmp, cfg.on_error == "fail", files)
            for k, items in enumerate(part.plan(source.items, cfg, workers, urls.is_url(cfg.out)))]
    stats, shards, start = part.PartStats(), [], 0
    for res in _run_parts(jobs, workers, cfg.progress, len(source.items)):
        report.extend(res.problems)
        if res.failed is not None:
            raise PackError(f"--on-error fail: {res.failed.describe()}", report)
        stats.merge(res.stats)
        if res.shard is not None:   # number the shards that hold records 0, 1, 2, ...
            shard, file = res.shard, name(len(shards))
            if shard["file"] != file:
                os.rename(tmp / shard["file"], tmp / file)
            shard.update(file=file, start=start)
            start += shard["count"]
            shards.append(shard)
            if sink is not None:
                sink(tmp / file, file)
    if not shards:
        return None
    # Nothing is published past here unless the boxes can train: a set annotated on the raw pixels, one in
    # which (almost) no image kept a box, or one that lost over --max-dropped of its images or boxes for one
    # reason, stops (the caller removes what was written).
    if (verdict := raw_annotation_verdict(stats.exif_frames, source.annotation_files)) is not None:
        raise PackError(verdict, report)
    if not cfg.allow_background_only:
        check_kept(source, start, stats.boxed_images, report)
    check_dropped(start, stats.num_boxes + stats.num_crowd, report, cfg.max_dropped)
    manifest = build_manifest(cfg, source, shards, stats, report, workers)
    if files is not None:   # a source in a bucket: name it, not the local stand-in
        manifest.source["root"] = urls.shown(files.url)
        manifest.source["annotations"] = [urls.shown(files.url_of(a)) for a in source.annotation_files]
    return manifest


def _pack_to_url(cfg: PackConfig, src, files) -> PackResult:
    """Shards uploaded as they complete, rejects.jsonl, the manifest last, then the old pack's shards removed
    (pack/remote.py)."""
    t0 = time.perf_counter()
    dest = remote.Destination(cfg.out, cfg.storage_options)
    with pack_lock(remote.stand_in_lock_path(cfg.out)):
        old = dest.existing()
        if old is not None and not cfg.overwrite:
            raise PackError(f"{dest.where} already holds a store; pass --force to replace it (readers keep the old pack "
                            "until the new manifest is in place)")
        source, report = _open(cfg, src)
        pack_id = secrets.token_hex(4)
        tmp = remote.staging_dir("pack")   # named with this pid: a killed pack's is removed by the next
        try:
            manifest = (_pack_into(tmp, cfg, source, report, files, lambda k: fmt.shard_file(k, pack_id), dest.add_shard)
                        if source.items else None)
            report.write_rejects(tmp / fmt.REJECTS)
            if manifest is None:
                dest.abandon()
                where = dest.put_rejects((tmp / fmt.REJECTS).read_bytes(), beside=old is not None)
                raise PackError(f"nothing usable was packed: all {len(source.items)} images were rejected; the reasons "
                                f"are listed in {where} ({dest.where} is {'unchanged' if old is not None else 'not a store'})",
                                report, where)
            dest.finish(manifest, tmp / fmt.REJECTS)
        except BaseException:
            dest.abandon()
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            dest.close()
    return PackResult(cfg.out, manifest, report, time.perf_counter() - t0, source.describe(),
                      urls.join(urls.shown(cfg.out), fmt.REJECTS))


def _keep_rejects(tmp: Path, out: Path, report: PackReport, n: int) -> NoReturn:
    """Every image was rejected: leave the list of reasons where the user looks, never in place of a store."""
    if (out / fmt.MANIFEST).is_file():  # --force over a store: the store stays as it was
        where = out.parent / f"{out.name}.{fmt.REJECTS}"
        os.replace(tmp / fmt.REJECTS, where)
        note = f"{out} is unchanged"
    else:
        publish(tmp, out, overwrite=True)  # OUT is new, or holds only an earlier failed pack's list
        where, note = out / fmt.REJECTS, f"{out} holds only that file: it is not a store"
    what = f"all {n} images were rejected" if n else "no image could be listed"
    raise PackError(f"nothing usable was packed: {what}; the reasons are listed in {where} ({note})", report, where)
