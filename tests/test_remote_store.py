"""Stores in object storage, against a real S3 API (moto's server on 127.0.0.1; no mocks of boto3 or s3fs): pack
to and from a bucket, reads equal to a local pack, every loader, --force while a reader holds the old manifest,
the errors (a damaged shard, a missing bucket, missing credentials, a full cache), the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import pickle

import numpy as np
import pytest
import torch
from s3_helpers import upload_dir

from fastfeed import Store
from fastfeed.cli import main
from fastfeed.loaders import LoaderConfig, create_loader
from fastfeed.loaders.shard_order import default_order
from fastfeed.pack import PackConfig, PackError, pack
from fastfeed.store import FormatError, objstore
from fastfeed.store.format import StoreChanged
from fastfeed.store.objstore import RemoteError
from fastfeed.store.options import StoreOptions
from fastfeed.store.remote import CacheFull, ShardDamaged


@pytest.fixture(autouse=True)
def _env(remote_env):
    """`fastfeed` flags set the environment the Stores read (one command per process): put back after each test."""


def run_pack(src, out, **kw):
    kw.setdefault("workers", 1)
    kw.setdefault("progress", False)
    return pack(PackConfig(src=src, out=out, **kw))


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory):
    from conftest import CocoBuilder

    b = CocoBuilder(tmp_path_factory.mktemp("remote") / "coco")
    for k in range(40):
        b.add_image(f"{k:03d}.jpg", h=60 + k % 3 * 8, w=80, seed=k, boxes=[(1 + 2 * (k % 2), [5, 5, 30, 20])])
    return b.write()


@pytest.fixture(scope="module")
def local_store(coco_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "coco.ff"
    run_pack(coco_src, out, shards=10)
    return Store(out)


@pytest.fixture(scope="module")
def url_store(s3, coco_src):
    url = f"s3://{s3.bucket()}/coco.ff"
    run_pack(coco_src, url, shards=10)
    return url


def records_equal(a, b):
    assert len(a) == len(b) and a.fingerprint == b.fingerprint and a.class_names == b.class_names
    for i in range(len(a)):
        x, y = a.record(i), b.record(i)
        assert bytes(x.payload) == bytes(y.payload) and x.file_name == y.file_name
        np.testing.assert_array_equal(x.boxes, y.boxes)


def test_pack_to_a_bucket_reads_as_the_local_pack(url_store, local_store, s3, tmp_path):
    store = Store(url_store, shard_cache=tmp_path / "cache")
    assert type(store) is Store and store.remote and not local_store.remote   # one Store, its provider differs
    records_equal(store, local_store)
    names = {o["Key"] for o in s3.client().list_objects_v2(Bucket=url_store.split("/")[2])["Contents"]}
    assert {"coco.ff/manifest.json", "coco.ff/rejects.jsonl"} <= names
    shards = sorted(n for n in names if n.startswith("coco.ff/shard-"))
    assert len(shards) == 10 and all(s.split("/")[1] == f.file for s, f in zip(shards, store.shards))
    assert all(len(f.sha256) == 64 for f in store.shards)
    assert {d["shard"] for d in store.cache.fetched()} == {s.file for s in store.shards}   # each once
    store.close()


@pytest.mark.parametrize("layout", ["coco", "yolo"])
def test_pack_from_a_bucket_as_from_the_folder(layout, coco_src, s3, tmp_path):
    from conftest import YoloBuilder

    if layout == "coco":
        src = coco_src
    else:
        y = YoloBuilder(tmp_path / "yolo", names=["a", "b"])
        for k in range(12):
            y.add(f"{k:02d}", [f"{k % 2} 0.5 0.5 0.3 0.2"], seed=k)
        y.add("nolabel", None, seed=99)
        (y.labels_dir / "orphan.txt").write_text("0 0.5 0.5 0.1 0.1\n")
        src = tmp_path / "yolo"
    bucket = s3.bucket()
    upload_dir(src, f"s3://{bucket}/data")
    here = run_pack(src, tmp_path / "here.ff")
    there = run_pack(f"s3://{bucket}/data", tmp_path / "there.ff", workers=2)
    records_equal(Store(tmp_path / "here.ff"), Store(tmp_path / "there.ff"))
    assert there.report.to_dict()["errors"] == here.report.to_dict()["errors"]
    assert there.manifest.source["root"] == f"s3://{bucket}/data"
    assert there.manifest.source["fingerprint"] == here.manifest.source["fingerprint"]
    both = run_pack(f"s3://{bucket}/data", f"s3://{bucket}/out.ff")   # bucket to bucket
    assert both.manifest.fingerprint == here.manifest.fingerprint
    assert there.source_desc.endswith(f"(s3://{bucket}/data)")   # the bucket, not the local stand-in's path
    with pytest.raises(PackError) as e:
        run_pack(f"s3://{bucket}/data", tmp_path / "none.ff", split="nope")
    assert f"s3://{bucket}/data" in str(e.value) and "staging" not in str(e.value), str(e.value)


def test_a_source_bucket_out_mid_pack_stops_it_instead_of_dropping_images(coco_src, s3, tmp_path, monkeypatch):
    """An outage that outlasts the retries is the source, not its images: the pack stops and writes nothing (it
    counted them `unreadable_image` and packed a smaller dataset, exit 0). A missing object is still a rejection."""
    from fastfeed.pack import remote

    bucket = s3.bucket()
    upload_dir(coco_src, f"s3://{bucket}/data")
    fetch_many = objstore.fetch_many

    def outage(fs, paths, url_of, **kw):
        got = fetch_many(fs, paths, url_of, **kw)
        return {p: RemoteError(f"reading {url_of(p)} failed 6 times; the last failure: EndpointConnectionError")
                for p in paths} | {p: v for p, v in list(got.items())[:1]}

    monkeypatch.setattr(remote.objstore, "fetch_many", outage)
    with pytest.raises(PackError, match="failed 6 times.*the source could not be read, not an image: nothing was "
                                        "written"):
        run_pack(f"s3://{bucket}/data", tmp_path / "out.ff")
    assert not (tmp_path / "out.ff").exists()


def test_the_benchmarks_plain_object_server_serves_a_store_as_s3_does(url_store, local_store, s3, tmp_path):
    """`benchmarks/remote_store.py` reads its store from `s3_helpers.ObjectServer` (a copy of the bucket, GET and HEAD
    with a range): the records equal the local pack's, a missing object is a missing object, an empty one empty."""
    from s3_helpers import ObjectServer

    bucket = url_store.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key="empty", Body=b"")
    server = ObjectServer.copy_of(s3.endpoint, [bucket])
    s3.use(server.endpoint)
    try:
        store = Store(url_store, shard_cache=tmp_path / "c")
        records_equal(store, local_store)
        fs, _ = objstore.filesystem(url_store)
        assert objstore.whole(fs, f"{bucket}/empty") == b""
        with pytest.raises(FormatError, match="is not a fastfeed store"):
            Store(f"s3://{bucket}/nothing.ff", shard_cache=tmp_path / "c")
        store.close()
    finally:
        s3.use(s3.endpoint)
        server.stop()


def test_every_loader_reads_a_url_store(url_store, local_store, tmp_path):
    store = Store(url_store, shard_cache=tmp_path / "c")
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=1, seed=1)
    for name, opts in (("cpu", {}), ("shm", {"cache_dir": str(tmp_path)}), ("device", {})):
        with create_loader(name, store, cfg, **opts) as loader, \
                create_loader(name, local_store, cfg, order=loader.order, **opts) as here:
            for a, b in zip(loader, here):
                assert np.array_equal(a.indices, b.indices)
                assert np.array_equal(a.images.cpu(), b.images.cpu())   # the same samples, bit for bit
    store.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_dali_loader_reads_a_url_store(url_store, local_store, tmp_path, workers):
    """DALI's external source (in this thread, or in DALI's worker processes) reads a URL store through the shard
    cache: the same samples as from the local pack."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -e '.[dali]')")
    store = Store(url_store, shard_cache=tmp_path / "c")
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=workers, seed=1, device="cpu")
    with create_loader("dali", store, cfg) as loader, create_loader("dali", local_store, cfg, order=loader.order) as here:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            here.set_epoch(epoch)
            for a, b in zip(loader, here, strict=True):
                assert np.array_equal(a.indices, b.indices)
                assert np.array_equal(a.images.cpu(), b.images.cpu()) and torch.equal(a.targets, b.targets)
    store.close()


def test_a_shard_object_removed_without_a_repack_is_named_missing_not_a_repack(coco_src, s3, tmp_path):
    url = f"s3://{s3.bucket()}/s.ff"
    run_pack(coco_src, url, shards=4)
    store = Store(url, shard_cache=tmp_path / "c")
    s3.client().delete_object(Bucket=url.split("/")[2], Key=f"s.ff/{store.shards[-1].file}")
    with pytest.raises(RemoteError, match=f"shard {url}/{store.shards[-1].file} is missing from the bucket, though its "
                                          "store was not re-packed: restore the object, or re-pack") as e:
        store.record(len(store) - 1)
    assert not isinstance(e.value, StoreChanged)


def test_force_while_a_reader_holds_the_old_manifest(coco_src, s3, tmp_path):
    url = f"s3://{s3.bucket()}/s.ff"
    run_pack(coco_src, url, shards=4)
    old = Store(url, shard_cache=tmp_path / "c")
    before = old.record(0)                                    # shard 0 is cached now
    run_pack(coco_src, url, shards=5, overwrite=True, store="jpeg", quality=50)
    new = Store(url, shard_cache=tmp_path / "c")
    assert new.fingerprint != old.fingerprint and not {s.file for s in new.shards} & {s.file for s in old.shards}
    assert bytes(old.record(1).payload) == bytes(before.payload) or old.record(1).index == 1   # cached: its own pack
    with pytest.raises(StoreChanged, match="re-packed .* open it again"):
        old.record(len(old) - 1)                              # not cached, and gone from the bucket
    assert len(new) == len(old) and new.record(len(new) - 1).index == len(new) - 1
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=url.split("/")[2])["Contents"]}
    assert {k.split("/")[1] for k in keys if "shard-" in k} == {s.file for s in new.shards}   # old shards removed
    with pytest.raises(PackError, match="already holds a store; pass --force"):
        run_pack(coco_src, url)
    old.close()
    new.close()


def test_an_interrupted_pack_leaves_the_old_store_and_no_new_shards(coco_src, s3, tmp_path, monkeypatch):
    from fastfeed.store import objstore

    url = f"s3://{s3.bucket()}/s.ff"
    run_pack(coco_src, url, shards=3)
    before = {o["Key"] for o in s3.client().list_objects_v2(Bucket=url.split("/")[2])["Contents"]}
    real, calls = objstore.upload, []

    def fail_second(*a, **kw):
        calls.append(a)
        if len(calls) == 2:
            raise RemoteError("the network went away")
        return real(*a, **kw)

    monkeypatch.setattr(objstore, "upload", fail_second)
    with pytest.raises(RemoteError, match="went away"):
        run_pack(coco_src, url, shards=4, overwrite=True)
    after = {o["Key"] for o in s3.client().list_objects_v2(Bucket=url.split("/")[2])["Contents"]}
    assert after == before                                    # the new pack's first shard removed again
    records_equal(Store(url, shard_cache=tmp_path / "c"), Store(url, shard_cache=tmp_path / "d"))
    fresh = f"s3://{url.split('/')[2]}/fresh.ff"
    calls.clear()
    with pytest.raises(RemoteError):
        run_pack(coco_src, fresh, shards=4)
    with pytest.raises(FormatError, match="not a fastfeed store: it has no manifest.json"):
        Store(fresh, shard_cache=tmp_path / "c")


def test_a_damaged_shard_object_is_named(coco_src, s3, tmp_path, caplog):
    bucket = s3.bucket()
    url = f"s3://{bucket}/s.ff"
    run_pack(coco_src, url, shards=3)
    store = Store(url, shard_cache=tmp_path / "c")
    key = f"s.ff/{store.shards[1].file}"
    body = bytearray(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF                               # same size, other bytes
    s3.client().put_object(Bucket=bucket, Key=key, Body=bytes(body))
    store.record(0)
    with pytest.raises(ShardDamaged, match=f"shard {url}/{store.shards[1].file} is damaged: downloaded twice"):
        store.record(store.shards[1].start)
    assert "downloading it again" in caplog.text
    assert not any(p.name.startswith(store.shards[1].file) and ".part-" in p.name for p in store.cache.dir.iterdir())
    assert not store.cache.present(store.shards[1])           # never opened, never kept
    assert main(["verify", url, "--quiet", "--workers", "1", "--shard-cache", str(tmp_path / "v")]) == 1


@pytest.mark.slow   # ~7 s: it waits out the timeouts
def test_an_endpoint_that_never_answers_is_given_up_on_in_bounded_time(s3, tmp_path, monkeypatch):
    """A host that accepts connections and never replies: botocore's and s3fs's own retries under fastfeed's kept a
    read waiting for hours in silence (botocore's 5 attempts of 60 s under each of ours). With a 3 s read timeout and
    one try of ours: botocore's 2 attempts, 6 s (15 s before)."""
    import socket
    import threading
    import time

    from s3_helpers import _forget_filesystems

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held, stop = [], threading.Event()

    def accept():   # takes every connection and says nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    _forget_filesystems()
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="failed 1 times"):
            Store("s3://silent/x.ff", shard_cache=tmp_path, retries=1,
                  storage_options={"config_kwargs": {"read_timeout": 3}})
        assert time.monotonic() - t0 < 12
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        listener.close()
        _forget_filesystems()


def test_missing_bucket_missing_store_and_missing_credentials_say_what_to_do(s3, url_store, tmp_path, monkeypatch):
    with pytest.raises(FormatError, match="bucket s3://no-such-bucket-here does not exist"):
        Store("s3://no-such-bucket-here/x.ff", shard_cache=tmp_path)
    with pytest.raises(FormatError, match="not a fastfeed store"):
        Store(f"s3://{url_store.split('/')[2]}/nothing.ff", shard_cache=tmp_path)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from s3_helpers import _forget_filesystems

    _forget_filesystems()
    with pytest.raises(RemoteError, match="no credentials found .* AWS_ACCESS_KEY_ID"):
        Store(url_store, shard_cache=tmp_path)
    monkeypatch.undo()
    _forget_filesystems()
    with pytest.raises(ValueError, match="folder"):
        Store(tmp_path, shard_cache_limit="1G")                     # a cache option for a local store


def test_a_cache_too_small_or_a_full_disk_is_one_line(url_store, tmp_path):
    store = Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=1000)
    with pytest.raises(CacheFull, match="more than the whole shard cache limit"):
        store.record(0)
    store = Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=3 * store.shards[0].bytes)
    with pytest.raises(ValueError, match="holds fewer shards .* than the windowed order needs"):
        create_loader("cpu", store, LoaderConfig(imgsz=64, batch_size=4, workers=0))
    disk = tmp_path / "tiny"
    disk.mkdir()
    if os.system(f"mount -t tmpfs -o size=64k tmpfs {disk} 2>/dev/null") != 0:
        pytest.skip("cannot mount a small tmpfs here (not root?)")
    full = None
    try:
        full = Store(url_store, shard_cache=disk, shard_cache_limit="1G")
        assert sum(s.bytes for s in full.shards) > 64 << 10
        with pytest.raises(CacheFull, match="disk is full .* free space there"):
            for s in full.shards:
                full.record(s.start)
    finally:
        if full is not None:
            full.close()
        assert os.system(f"umount {disk}") == 0


def test_the_read_ahead_is_at_least_16_mb_by_default_and_a_quarter_of_the_cache_at_most(url_store, tmp_path, monkeypatch):
    from dataclasses import replace

    from fastfeed.store.remote.shards import DEFAULT_READ_AHEAD, READ_AHEAD_BYTES

    probe = Store(url_store, shard_cache=tmp_path / "c")
    largest = max(s.bytes for s in probe.shards)
    mean = sum(s.bytes for s in probe.shards) / len(probe.shards)
    assert READ_AHEAD_BYTES // largest > len(probe.shards)          # tiny shards: the read-ahead wants more
    # Capped by what fills a quarter of the cache's bytes at the mean shard size (the rest is the window), never
    # below 2 ...
    assert 2 < int(3 * largest / mean) < len(probe.shards)
    assert Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=12 * largest).read_ahead == int(3 * largest / mean)
    assert Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=4 * int(mean)).read_ahead == DEFAULT_READ_AHEAD
    # ... and by the store's shards.
    assert Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=400 * largest).read_ahead == len(probe.shards)
    # Shards of the URL default (128 MB): two ahead are already seconds of training.
    big = Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=64 << 30).provider
    big.shards = [replace(s, bytes=128 << 20) for s in big.shards]
    assert big.default_read_ahead() == DEFAULT_READ_AHEAD
    big.shards = [replace(s, bytes=4 << 20) for s in big.shards]   # 4 MB ones: four make the read-ahead
    assert big.default_read_ahead() == 4
    # What is asked for is what is used, from Python (keywords or StoreOptions) and from the environment as the
    # entry points resolve it (StoreOptions.from_env); the store itself reads no environment.
    assert Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=12 * largest, read_ahead=1).read_ahead == 1
    opts = StoreOptions(shard_cache=tmp_path / "c", shard_cache_limit=12 * largest, read_ahead=3)
    assert Store(url_store, options=opts).read_ahead == 3 and Store(url_store, options=opts).read_ahead_given
    monkeypatch.setenv("FASTFEED_READ_AHEAD_SHARDS", "5")
    assert not Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit=12 * largest).read_ahead_given
    store = Store(url_store, options=StoreOptions.from_env(os.environ, shard_cache=tmp_path / "c", shard_cache_limit=12 * largest))
    assert store.read_ahead == 5 and store.reopen().read_ahead == 5
    assert pickle.loads(pickle.dumps(store)).read_ahead == 5
    assert StoreOptions.from_env(os.environ, opts).read_ahead == 3                 # given beats the environment


def test_the_old_name_of_the_read_ahead_still_works_and_warns_with_the_new_one(url_store, tmp_path):
    with pytest.warns(DeprecationWarning, match=r"StoreOptions\(prefetch_depth=...\) is deprecated: use "
                                                r"StoreOptions\(read_ahead=...\)"):
        opts = StoreOptions(shard_cache=tmp_path / "c", prefetch_depth=3)
    assert opts.read_ahead == 3
    with pytest.warns(DeprecationWarning, match="use StoreOptions.read_ahead"):
        assert opts.prefetch_depth == 3
    with pytest.warns(DeprecationWarning, match=r"use StoreOptions\(read_ahead=...\)"):
        store = Store(url_store, shard_cache=tmp_path / "c", prefetch_depth=2)
    assert store.read_ahead == 2 and store.read_ahead_given
    with pytest.warns(DeprecationWarning, match="use Store.read_ahead"):
        assert store.prefetch_depth == 2
    with pytest.raises(TypeError, match="give read_ahead only"):
        StoreOptions(read_ahead=1, prefetch_depth=2)
    store.close()


def test_a_tight_cache_shortens_the_default_read_ahead_before_it_refuses(coco_src, s3, tmp_path):
    url = f"s3://{s3.bucket()}/one-per-shard.ff"
    run_pack(coco_src, url, shards=40)
    probe = Store(url, shard_cache=tmp_path / "c")
    largest = max(s.bytes for s in probe.shards)
    cfg = LoaderConfig(imgsz=64, batch_size=1, workers=2, batches_ahead=7)   # 15 batches in flight: 16 shards leaving
    store = Store(url, shard_cache=tmp_path / "c", shard_cache_limit=20 * largest)
    assert store.read_ahead == 5
    order = default_order(store, cfg, 0, 1)                             # the loaders choose it, from the facts
    assert order.describe()["read_ahead_shards"] == 2 and order.describe()["window_shards"] == 1
    asked = Store(url, shard_cache=tmp_path / "c", shard_cache_limit=20 * largest, read_ahead=5)
    with pytest.raises(ValueError, match="5 read ahead .* lower read_ahead"):
        default_order(asked, cfg, 0, 1)                                  # asked for: used, or refused
    for s in (probe, store, asked):
        s.close()


def test_a_read_ahead_asked_for_is_kept_when_the_cache_holds_the_whole_store(url_store, tmp_path):
    """A cache that holds the whole store reads every shard ahead, unless a read-ahead was asked for: then that one
    (read_ahead=0: each shard only when a batch needs it), never silently more."""
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0)
    sized = Store(url_store, shard_cache=tmp_path / "c")
    asked = Store(url_store, shard_cache=tmp_path / "c", read_ahead=0)
    try:
        assert default_order(sized, cfg, 0, 1).read_ahead is None              # every shard
        assert default_order(asked, cfg, 0, 1).read_ahead == 0
    finally:
        sized.close()
        asked.close()


def test_the_shards_a_read_waits_for_download_first_alone_at_the_start_then_beside_the_next_ones(url_store, tmp_path):
    import threading
    import time

    from fastfeed.store.remote.read_ahead import ReadAhead

    store = Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit="1G", read_ahead=3)   # asked: all 3 ahead
    events, lock = [], threading.Lock()
    real = store.provider.fetch

    def slow_fetch(k, wait=True, held=None):
        with lock:
            events.append(("start", k))
        time.sleep(0.15)
        real(k, wait, held=held)
        with lock:
            events.append(("end", k))
        return True

    store.provider.fetch = slow_fetch

    def run(p, now, upcoming, downloads=None):   # downloads: how many start (default: every shard named)
        events.clear()
        p.want(now, upcoming)
        deadline = time.monotonic() + 20
        while (sum(e == "end" for e, _ in events) < (downloads or len(now) + len(upcoming))
               and time.monotonic() < deadline):
            time.sleep(0.02)
        return [k for e, k in events if e == "start"]

    # (downloads kept in flight, whether one ended before: the start) -> whether the next ones wait for a needed-now
    for parallel, started, waits in ((3, False, True), (3, True, False), (2, True, True)):
        p = ReadAhead(store.provider)
        p.parallel = lambda n=parallel: n
        try:
            if started:
                run(p, [], [5])
            starts = run(p, [0, 1], [2, 3, 4])
        finally:
            p.stop()
        assert sorted(starts[:2]) == [0, 1] and starts[2:] == [2, 3, 4]      # needed now first, then in reading order
        now_done = min(events.index(("end", 0)), events.index(("end", 1)))
        assert (events.index(("start", 2)) > now_done) == waits, (parallel, started)
        assert all(store.cache.present(store.shards[k]) for k in range(5))
        for k in range(6):
            store.cache.file(store.shards[k]).unlink(missing_ok=True)
    # The next batches' shards, claimed at the start, download after the first batch's; later claims at once.
    p = ReadAhead(store.provider)
    try:
        events.clear()
        p.want([0], [])
        p.want([0, 1], [])
        deadline = time.monotonic() + 20
        while sum(e == "end" for e, _ in events) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert events.index(("start", 1)) > events.index(("end", 0))
        starts = run(p, [0, 1, 2, 3], [], downloads=2)      # 0 and 1 are here
        assert sorted(starts) == [2, 3] and events.index(("start", 3)) < events.index(("end", 2))
    finally:
        p.stop()
    store.close()


def test_a_worker_reading_what_the_read_ahead_needs_now_waits_for_its_download(url_store, local_store, s3, tmp_path):
    """The shards a read waits for are claimed (their download locks taken) before `want` returns: a worker forked
    to read them waits for the read-ahead's downloads instead of racing them with its own (its own S3 client)."""
    import multiprocessing as mp

    from s3_helpers import FaultProxy

    from fastfeed.store.remote.read_ahead import ReadAhead

    with FaultProxy(s3.port, latency=0.3) as proxy:
        s3.use(proxy.url)
        try:
            store = Store(url_store, cache_dir=tmp_path / "c", cache_limit="1G")
            p = ReadAhead(store.provider)
            p.want([0, 1], [])
            child = mp.get_context("fork").Process(target=_read_records, args=(store, [0, 1]))
            child.start()
            child.join(60)
            p.stop()
            assert child.exitcode == 0
            got = sorted((f["shard"], f["pid"]) for f in store.cache.fetched())
            assert got == sorted((store.shards[k].file, os.getpid()) for k in (0, 1))   # once each, by the read-ahead
            for i in range(store.shards[0].start, store.shards[2].start):   # theirs (the rest at 0.3 s a request)
                assert bytes(store.record(i).payload) == bytes(local_store.record(i).payload)
            store.close()
        finally:
            s3.use(s3.endpoint)


def test_the_pool_loader_starts_the_first_batchs_downloads_before_it_forks_its_workers(local_store):
    """The order hears where the loader starts before the workers start (the first batch's downloads run while they
    fork), and again as each batch is handed out."""
    from fastfeed.loaders.sampler import ShuffledOrder
    from fastfeed.loaders.windowed import FollowedOrder

    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=1)
    heard, box = [], {}
    order = FollowedOrder(ShuffledOrder.for_loader(len(local_store), cfg, 0, 1), [s.start for s in local_store.shards],
                          read_ahead=0, lookback=0, follow=lambda now, nxt: heard.append((now, box["ld"]._pool)))
    with create_loader("cpu", local_store, cfg, order=order) as loader:
        box["ld"] = loader
        loader.set_epoch(0)
        next(iter(loader))
    first = sorted(set(np.searchsorted([s.start for s in local_store.shards], order.batches(0)[0], side="right") - 1))
    assert sorted(heard[0][0]) == first and heard[0][1] is None     # batch 0's shards, no worker yet
    assert any(pool is not None for _, pool in heard[1:])           # then as batches are handed out


def test_a_batch_reads_first_what_is_here_then_each_shard_as_its_download_ends(url_store, tmp_path):
    """`Store.arrival`: a record whose shard is cached, or missing with nobody downloading it (its read downloads
    it), comes before one whose shard another download is bringing; that one comes once the download ends."""
    import threading

    store = Store(url_store, shard_cache=tmp_path / "c", shard_cache_limit="1G")
    start = [s.start for s in store.shards]
    store.fetch(0)                                                   # here
    held = store.cache.claim(store.shards[1], store.shard_url(1))   # downloading (this test holds its lock)
    indices = [start[1], start[2], start[0], start[1] + 1, start[0] + 1]
    assert [store.provider.waiting(k) for k in range(3)] == [False, True, False]
    order = store.arrival(indices)
    assert [next(order) for _ in range(3)] == [1, 2, 4]              # shard 2 (nobody's), then shard 0's records
    assert store.provider.waiting(1)
    done = threading.Thread(target=store.provider.fetch, args=(1,), kwargs={"held": held})
    done.start()                                                     # the download ends (and lets go of its lock)
    assert list(order) == [0, 3]
    done.join()
    assert store.cache.present(store.shards[1]) and not store.provider.waiting(1)
    assert list(store.arrival(indices)) == [0, 1, 2, 3, 4]          # no download under way: the batch's order
    store.close()


def _read_records(store, shards):
    for k in shards:
        store.record(store.shards[k].start)


def test_cli_pack_inspect_verify_bench_and_the_shard_cache(coco_src, s3, tmp_path, capsys, monkeypatch):
    url = f"s3://{s3.bucket()}/cli.ff"
    cache = str(tmp_path / "shards")
    assert main(["pack", str(coco_src), "-o", url, "--shards", "12", "--quiet"]) == 0
    assert f"-> {url}:" in capsys.readouterr().out
    assert main(["inspect", url, "--json", "--shard-cache", cache]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == url
    assert main(["verify", url, "--quiet", "--shard-cache", cache]) == 0
    assert "OK, 40 records" in capsys.readouterr().out
    limit = str(int(sum(s.bytes for s in Store(url, shard_cache=cache).shards) * 0.9))
    assert main(["bench", "--data", url, "--loader", "cpu", "--batches", "3", "--warmup", "1", "--workers", "1",
                 "--imgsz", "64", "--batch", "4", "--quiet", "--shard-cache", str(tmp_path / "b"),
                 "--shard-cache-limit", limit, "--read-ahead-shards", "1"]) == 0
    assert "FASTFEED_SHARD_CACHE_LIMIT" not in os.environ and "FASTFEED_READ_AHEAD_SHARDS" not in os.environ
    assert os.environ["FASTFEED_SHARD_CACHE"] != str(tmp_path / "b")      # the flags are passed, never set
    out = capsys.readouterr().out
    assert "order windowed (shard-aware): a window of" in out and "shards read ahead: 1," in out
    assert "; link: " in out                                             # what the link did (or nothing yet)
    assert main(["cache", "ls", "--shards", "--shard-cache", cache]) == 0
    out = capsys.readouterr().out
    assert url in out and " 12 " in out
    empty = tmp_path / "no-shm"
    empty.mkdir()
    assert main(["cache", "ls", "--shm-dir", str(empty), "--shard-cache", cache]) == 0   # both kinds, by default
    out = capsys.readouterr().out
    assert f"{empty}: no fastfeed caches" in out and url in out
    assert main(["cache", "clear", "--shards", "--shard-cache", cache]) == 0
    assert "1 removed" in capsys.readouterr().out
    assert not any((tmp_path / "shards").glob("store-*/*.mdb"))
    assert main(["cache", "build", url, "--imgsz", "64", "--shm-dir", str(tmp_path), "--quiet", "--shard-cache", cache]) == 0
    assert "built, 40/40 images" in capsys.readouterr().out
    assert main(["cache", "clear", "--shm-dir", str(tmp_path), "--shm"]) == 0
    assert main(["inspect", "s3://no-such-bucket-x/a.ff", "--shard-cache", cache]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_large_shards_download_in_parallel_ranged_parts(url_store, local_store, tmp_path, monkeypatch, s3):
    from fastfeed.store import objstore

    monkeypatch.setattr(objstore, "PART_BYTES", 4096)        # every shard in many ranged reads
    store = Store(url_store, shard_cache=tmp_path / "c")
    assert store.shards[0].bytes > 4 * 4096
    records_equal(store, local_store)                        # sha256-checked, then read
    store.close()


def test_a_shard_download_and_a_whole_object_read_are_one_request_each(url_store, local_store, s3, tmp_path):
    """s3fs's cat_file without a range asks the size first (HEAD): a second round trip before every first byte."""
    from s3_helpers import FaultProxy

    from fastfeed.store import objstore

    s3.client().put_object(Bucket=url_store.split("/")[2], Key="empty", Body=b"")
    with FaultProxy(s3.port) as proxy:
        s3.use(proxy.url)
        try:
            store = Store(url_store, cache_dir=tmp_path / "c")
            opened = proxy.requests                                 # the manifest, and the connections' HEADs
            for k in range(len(store.shards)):
                store.fetch(k)
            assert proxy.requests == opened + len(store.shards)     # one GET a shard
            records_equal(store, local_store)
            store.close()
            fs, _ = objstore.filesystem(url_store)
            assert objstore.read_bytes(fs, f"{url_store.split('/')[2]}/empty", "s3://x/empty") == b""
            assert proxy.requests == opened + 1 + len(store.shards)
        finally:
            s3.use(s3.endpoint)


def test_a_store_opens_the_connections_its_first_downloads_use(url_store, local_store, s3, tmp_path, monkeypatch):
    """Beside the manifest's read, a URL store opens WARM - 1 more connections (a HEAD each): the first batch's
    downloads, started together, find them open instead of each paying a new connection's handshake."""
    import threading

    from s3_helpers import FaultProxy, ObjectServer

    from fastfeed.store.remote import link

    server = ObjectServer.copy_of(s3.endpoint, [url_store.split("/")[2]])   # keeps connections alive, as S3 does
    with FaultProxy(server.port, latency=0.02) as proxy:
        s3.use(proxy.url)
        try:
            store = Store(url_store, shard_cache=tmp_path / "c")
            assert proxy.connections == proxy.requests == link.WARM
            fetches = [threading.Thread(target=store.fetch, args=(k,)) for k in range(link.WARM)]
            for t in fetches:
                t.start()
            for t in fetches:
                t.join()
            assert proxy.connections == link.WARM and proxy.requests == 2 * link.WARM   # no new connection
            records_equal(store, local_store)
            store.close()
            monkeypatch.setattr(link, "WARM", 1)
            before = proxy.connections
            Store(url_store, shard_cache=tmp_path / "c").close()
            assert proxy.connections - before <= 1                  # WARM 1: the manifest's read alone
        finally:
            s3.use(s3.endpoint)
            server.stop()


def test_storage_options_from_the_cli_and_python_are_never_written(coco_src, s3, tmp_path, monkeypatch, capsys):
    url = f"s3://{s3.bucket()}/opts.ff"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    from s3_helpers import _forget_filesystems

    _forget_filesystems()
    secret = "very-secret-value-1234"
    opts = ["--storage-option", f"endpoint_url={s3.endpoint}", "--storage-option", "key=fastfeed-test",
            "--storage-option", f"secret={secret}"]
    assert main(["pack", str(coco_src), "-o", url, "--shards", "2", "--quiet", *opts]) == 0
    capsys.readouterr()
    assert "FASTFEED_STORAGE_OPTIONS" not in os.environ                         # passed, never set
    _forget_filesystems()
    # verify's worker processes get them with the pickled Store (the environment has no credentials)
    assert main(["verify", url, "--quiet", "--workers", "2", "--shard-cache", str(tmp_path / "v"), *opts]) == 0
    assert "OK, 40 records" in capsys.readouterr().out
    _forget_filesystems()
    store = Store(url, shard_cache=tmp_path / "c", storage_options={"endpoint_url": s3.endpoint, "key": "fastfeed-test",
                                                                  "secret": secret})
    assert len(store) == 40 and store.record(39).index == 39
    assert secret not in json.dumps(store.manifest.to_json()) and secret not in repr(store)
    assert all(secret not in p.read_text() for p in store.cache.dir.glob("*.json*"))
    # an option the client does not take, and a JSON value that does not parse: one line each, naming them
    _forget_filesystems()
    assert main(["inspect", url, "--shard-cache", str(tmp_path / "w"), *opts, "--storage-option", "foo=bar"]) == 1
    err = capsys.readouterr().err
    assert "the storage options hold one this file system does not take" in err and "foo" in err, err
    with pytest.raises(ValueError, match=r"--storage-option client_kwargs: '\{bad' is not valid JSON"):
        objstore.parse_option("client_kwargs={bad")


def test_what_is_retried_and_what_is_not():
    import botocore.exceptions

    from fastfeed.store import objstore, urls

    def client_error(code, status):
        return botocore.exceptions.ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                                               "GetObject")

    for e in (ConnectionResetError(), TimeoutError(), client_error("SlowDown", 503), client_error("InternalError", 500),
              OSError(5, "I/O")):
        assert objstore.kind(e) == "transient", e
    assert objstore.kind(FileNotFoundError()) == "missing" and objstore.kind(PermissionError()) == "denied"
    assert objstore.kind(botocore.exceptions.NoCredentialsError()) == "credentials"
    waits, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise client_error("SlowDown", 503)
        return b"ok"

    assert objstore.retry(flaky, "s3://b/x", "reading", sleep=waits.append) == b"ok"
    assert len(waits) == 3 and all(0 < w <= objstore.BACKOFF_S[1] for w in waits) and waits[0] < waits[2]
    with pytest.raises(RemoteError, match=r"reading s3://b/x failed 6 times; the last failure: ConnectionResetError"):
        objstore.retry(lambda: (_ for _ in ()).throw(ConnectionResetError("reset")), "s3://b/x", "reading",
                       sleep=waits.append)
    assert urls.shown("s3://user:pw@bucket/a") == "s3://bucket/a"
