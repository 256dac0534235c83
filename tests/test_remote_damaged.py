"""A damaged copy in the node's shard cache, against a real S3 API (moto on 127.0.0.1): a CRC or LMDB error in a
cached shard is downloaded again once and the read succeeds; a damaged bucket object is named as the bucket's;
`verify URL` checks the bucket, not the cache; a read-only cache that holds every shard reads, one that lacks a
shard says so; `cache clear --shards --force` under a reader leaves it reading."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fastfeed import Store
from fastfeed.cli import main
from fastfeed.store import FormatError
from fastfeed.store.format import record_key
from fastfeed.store.remote import ShardDamaged

PAGE = 4096   # LMDB's page: pages 0 and 1 are the meta pages, the rest the B-tree


@pytest.fixture(autouse=True)
def _env(remote_env):
    """`fastfeed` flags set the environment the Stores read: put back after each test."""


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from conftest import CocoBuilder
    from store_helpers import run_pack

    root = tmp_path_factory.mktemp("damaged")
    b = CocoBuilder(root / "coco")
    for k in range(24):
        b.add_image(f"{k:03d}.jpg", h=60 + k % 3 * 8, w=80, seed=k, boxes=[(1, [5, 5, 30, 20])])
    run_pack(b.write(), root / "s.ff", shards=4)
    return Store(root / "s.ff")


def upload(s3, local) -> tuple[str, str]:
    """The local store copied into a new bucket: (its URL, the bucket)."""
    from s3_helpers import upload_dir

    bucket = s3.bucket()
    url = f"s3://{bucket}/s.ff"
    upload_dir(local.path, url)
    return url, bucket


def record_span(store, index: int) -> tuple[Path, int, int]:
    """(cached shard file, byte offset, length) of record `index`'s bytes, from the map the store reads it through
    (where LMDB put it: the layout of a pack is not assumed)."""
    shard = store.shard_of(index)
    h = store.provider.handle(shard)
    buf = h.txn.get(record_key(index - store.shards[shard].start))
    addr = np.frombuffer(buf, np.uint8).ctypes.data
    file = store.cache.file(store.shards[shard])
    ino = os.stat(file).st_ino
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[4] == str(ino) and int(parts[2], 16) == 0:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return file, addr - lo, len(buf)
    raise AssertionError(f"no map of {file} holds record {index}")


def flip_record(store, index: int) -> Path:
    """Flip bytes in the middle of record `index` in the cached shard, in place (same size): a CRC error."""
    file, off, n = record_span(store, index)
    with open(file, "r+b") as f:
        f.seek(off + n // 2)
        b = f.read(4)
        f.seek(off + n // 2)
        f.write(bytes(x ^ 0xFF for x in b))
    return file


def zero_pages(file: Path) -> None:
    """Scribble over every B-tree page (zeros), the meta pages left: LMDB itself fails on the file."""
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.seek(2 * PAGE)
        f.write(bytes(size - 2 * PAGE))


def damage_object(s3, bucket: str, key: str) -> bytes:
    body = bytearray(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF                      # same size, other bytes
    s3.client().put_object(Bucket=bucket, Key=key, Body=bytes(body))
    return bytes(body)


def downloads(store, shard: int) -> int:
    return sum(d["shard"] == store.shards[shard].file for d in store.cache.fetched())


def test_a_crc_error_in_a_cached_shard_downloads_it_once_more_and_the_read_succeeds(s3, local, tmp_path, caplog):
    url, _ = upload(s3, local)
    store = Store(url, shard_cache=tmp_path / "c")
    i = store.shards[1].start + 1
    assert bytes(store.record(i).payload) == bytes(local.record(i).payload)
    file = flip_record(store, i)
    with open(file, "rb") as f:                       # the cached copy really is damaged now
        assert f.read() != (local.path / store.shards[1].file).read_bytes()
    assert bytes(store.record(i).payload) == bytes(local.record(i).payload)   # read again from a fresh copy
    assert downloads(store, 1) == 2 and "downloading the shard again" in caplog.text
    assert file.read_bytes() == (local.path / store.shards[1].file).read_bytes()
    for k in range(len(local)):                       # and every other record as before
        assert bytes(store.record(k).payload) == bytes(local.record(k).payload)
    store.close()


def test_an_lmdb_error_in_a_cached_shard_downloads_it_once_more(s3, local, tmp_path):
    url, _ = upload(s3, local)
    store = Store(url, shard_cache=tmp_path / "c")
    i = store.shards[2].start
    store.record(i)
    zero_pages(store.cache.file(store.shards[2]))
    assert bytes(store.record(i + 1).payload) == bytes(local.record(i + 1).payload)
    assert downloads(store, 2) == 2
    store.close()
    zero_pages(store.cache.file(store.shards[2]))    # damaged while no process maps it: found when opened
    store = Store(url, shard_cache=tmp_path / "c")
    assert bytes(store.record(i).payload) == bytes(local.record(i).payload)
    assert downloads(store, 2) == 3
    store.close()


def test_a_damaged_cached_copy_of_a_damaged_bucket_object_names_the_bucket(s3, local, tmp_path):
    url, bucket = upload(s3, local)
    store = Store(url, shard_cache=tmp_path / "c")
    i = store.shards[1].start
    store.record(i)
    flip_record(store, i)
    damage_object(s3, bucket, f"s.ff/{store.shards[1].file}")
    with pytest.raises(ShardDamaged, match=rf"the bucket's copy of shard {url}/{store.shards[1].file} is damaged: "
                                           "downloaded twice"):
        store.record(i)
    assert not store.cache.file(store.shards[1]).exists()   # the damaged copy is gone: nobody reads it again
    store.close()


def test_a_shard_damaged_when_packed_is_the_buckets_copy_after_one_fresh_download(s3, local, tmp_path):
    """The bucket's object matches the manifest's sha256 (it was written damaged): the cached copy is blamed first,
    downloaded once more, then the error says the bucket's copy is damaged."""
    from fastfeed.store.format import sha256_file

    url, bucket = upload(s3, local)
    store = Store(url, shard_cache=tmp_path / "c")
    i = store.shards[3].start
    store.record(i)
    damaged = flip_record(store, i)
    store.close()
    s3.client().put_object(Bucket=bucket, Key=f"s.ff/{store.shards[3].file}", Body=damaged.read_bytes())
    manifest = json.loads((local.path / "manifest.json").read_text())
    manifest["shards"][3]["sha256"] = sha256_file(damaged)
    s3.client().put_object(Bucket=bucket, Key="s.ff/manifest.json", Body=json.dumps(manifest).encode())
    store = Store(url, shard_cache=tmp_path / "fresh")
    with pytest.raises(ShardDamaged, match=rf"the bucket's copy of shard {url}/{store.shards[3].file} is damaged: "
                                           rf"record {i} .*CRC.* again in a fresh download"):
        store.record(i)
    assert downloads(store, 3) == 2
    store.close()


def test_verify_url_checks_the_bucket_not_the_cached_copy(s3, local, tmp_path, capsys):
    url, bucket = upload(s3, local)
    cache = str(tmp_path / "c")
    assert main(["verify", url, "--quiet", "--workers", "1", "--shard-cache", cache]) == 0
    capsys.readouterr()
    damage_object(s3, bucket, f"s.ff/{local.shards[2].file}")   # the cache still holds a good copy of it
    assert main(["verify", url, "--quiet", "--workers", "1", "--shard-cache", cache]) == 1
    out = capsys.readouterr().out
    assert f"the bucket's copy of shard {url}/{local.shards[2].file} is damaged" in out
    assert "the bucket holds damaged objects: restore them, or re-pack" in out


def test_a_truncated_object_is_a_damaged_shard_at_once_not_a_network_fault(s3, local, tmp_path, capsys, caplog):
    import time

    url, bucket = upload(s3, local)
    key = f"s.ff/{local.shards[1].file}"
    body = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.client().put_object(Bucket=bucket, Key=key, Body=body[: len(body) // 2])
    store = Store(url, shard_cache=tmp_path / "c")
    t0 = time.monotonic()
    with pytest.raises(ShardDamaged, match=rf"the bucket's copy of shard {url}/{local.shards[1].file} is damaged: "
                                           rf"{len(body) // 2} bytes, the manifest says {len(body)}\. Restore"):
        store.record(local.shards[1].start)
    assert time.monotonic() - t0 < 5 and "unreachable" not in caplog.text   # no retries with backoff
    store.close()
    assert main(["verify", url, "--quiet", "--workers", "1", "--shard-cache", str(tmp_path / "v")]) == 1
    out = capsys.readouterr().out
    assert f"{local.shards[1].file} is damaged: {len(body) // 2} bytes" in out and "the bucket holds damaged" in out


def test_verify_url_with_a_shard_cache_too_small_names_the_cache_not_the_bucket(s3, local, tmp_path, capsys):
    url, _ = upload(s3, local)
    assert main(["verify", url, "--quiet", "--workers", "1", "--shard-cache", str(tmp_path / "c"),
                 "--shard-cache-limit", "1K"]) == 1
    out, err = capsys.readouterr()
    assert "damaged" not in out + err and "the bucket holds" not in out
    assert "more than the whole shard cache limit" in err and "raise the limit (--shard-cache-limit" in err


def test_an_lmdb_error_in_a_local_store_names_the_shard(local, tmp_path):
    import shutil

    copy = tmp_path / "s.ff"
    shutil.copytree(local.path, copy)
    zero_pages(copy / local.shards[1].file)
    store = Store(copy)
    with pytest.raises(FormatError, match=rf"record {local.shards[1].start} in shard {copy / local.shards[1].file}: "
                                          "LMDB cannot read it .*run `fastfeed verify` and re-pack"):
        store.record(local.shards[1].start)
    store.close()


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def read_only(tmp_path):
    """read_only(folder) -> the same folder seen through a read-only bind mount (root; skipped where refused)."""
    mounted = []

    def make(folder: Path) -> Path:
        view = tmp_path / f"ro-{len(mounted)}"
        view.mkdir()
        if not _mount("--bind", str(folder), str(view)):
            pytest.skip("cannot bind-mount here (not root?)")
        mounted.append(view)
        if not _mount("-o", "remount,ro,bind", str(view)):
            pytest.skip("cannot remount read-only here")
        return view

    yield make
    for view in mounted:
        subprocess.run(["umount", str(view)], check=True)


def test_a_read_only_cache_holding_every_shard_reads_and_one_lacking_a_shard_says_so(s3, local, tmp_path, read_only,
                                                                                       capsys):
    url, _ = upload(s3, local)
    cache = tmp_path / "c"
    store = Store(url, shard_cache=cache)
    for s in store.shards:
        store.record(s.start)
    store.close()
    ro = read_only(cache)
    assert main(["cache", "build", url, "--imgsz", "64", "--shm-dir", str(tmp_path), "--quiet",
                 "--shard-cache", str(ro)]) == 0
    assert "built, 24/24 images" in capsys.readouterr().out
    assert main(["cache", "clear", "--shm-dir", str(tmp_path), "--shm"]) == 0
    assert main(["cache", "ls", "--shards", "--shard-cache", str(ro)]) == 0
    assert url in capsys.readouterr().out
    # One shard fewer: a named error, not `OSError: [Errno 30] Read-only file system`.
    partial = tmp_path / "p"
    store = Store(url, shard_cache=partial)
    store.record(store.shards[0].start)
    store.close()
    ro = read_only(partial)
    assert main(["cache", "build", url, "--imgsz", "64", "--shm-dir", str(tmp_path), "--quiet",
                 "--shard-cache", str(ro)]) == 1
    err = capsys.readouterr().err
    assert f"the shard cache {ro} is read-only" in err and f"lacks shard {url}/{store.shards[1].file}" in err
    assert "Traceback" not in err


def test_clearing_the_shard_cache_under_a_reader_leaves_it_reading(s3, local, tmp_path, capsys):
    from fastfeed.loaders import LoaderConfig, create_loader

    url, _ = upload(s3, local)
    cache = tmp_path / "c"
    # Nothing downloaded ahead (read_ahead=0): a shard the read-ahead thread wrote just after the clear would
    # make the cache folder non-empty depending on timing; here each shard comes when the reader needs it.
    store = Store(url, shard_cache=cache, read_ahead=0)
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, shuffle=False)
    with create_loader("cpu", store, cfg) as loader:
        it = iter(loader)
        seen = len(next(it)[0])
        assert main(["cache", "clear", "--shards", "--force", "--shard-cache", str(cache)]) == 0
        assert "1 removed" in capsys.readouterr().out and not any(cache.glob("store-*"))
        for images, _ in it:                         # the shards mapped keep reading, the others come again
            seen += len(images)
    assert seen == len(local)
    for k in range(len(local)):
        assert bytes(store.record(k).payload) == bytes(local.record(k).payload)
    store.close()
