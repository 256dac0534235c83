"""`Store` reads, integrity checks, and `verify` / `summarize`."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle

import numpy as np
import pytest
from test_pack import run_pack

from fastfeed import Store
from fastfeed.store import FormatError, RecordCorrupt
from fastfeed.store.verify import summarize, verify


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory):
    from fastfeed import sample_path

    out = tmp_path_factory.mktemp("s") / "sample.ff"
    run_pack(sample_path(), out, shards=3)
    return out


def _digest(args):
    path, indices = args
    store = Store(path)
    return [(i, store[i].file_name, int(store[i].image.sum()), store[i].boxes.tolist()) for i in indices]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_many_processes_read_the_same_store(sample_store, method):
    store = Store(sample_store)
    store[0]  # opened in the parent before forking: children must reopen their own handles
    expect = _digest((sample_store, range(len(store))))
    jobs = [(sample_store, range(k, len(store), 4)) for k in range(4)]
    with mp.get_context(method).Pool(2) as pool:
        got = sorted(x for part in pool.map(_digest, jobs) for x in part)
    assert got == expect


def test_store_pickles_small_and_works_after_unpickling(sample_store):
    store = Store(sample_store)
    store[3]
    blob = pickle.dumps(store)
    assert len(blob) < 20_000  # the manifest, not the data
    clone = pickle.loads(blob)
    assert clone[3].file_name == store[3].file_name and np.array_equal(clone[3].image, store[3].image)


def test_sample_fields_and_reduced_decode(sample_store):
    store = Store(sample_store)
    assert len(store) == 16 and len(store.class_names) == 80 and store.category_ids[:3] == [1, 2, 3]
    s = store[0]
    assert s.image.dtype == np.uint8 and s.image.shape == (*s.size, 3)
    assert s.boxes.dtype == np.float32 and s.boxes.shape[1] == 4 and s.classes.dtype == np.int64
    assert ((s.boxes >= 0) & (s.boxes <= 1)).all()
    small = store.get(0, min_size=(s.size[0] // 4, s.size[1] // 4))
    assert small.image.shape[0] >= s.size[0] // 4 and small.image.shape[0] < s.size[0] // 2 + 1
    with pytest.raises(IndexError, match="out of range: the store holds 16"):
        store[16]


def test_store_rejects_other_versions_and_non_stores(sample_store, tmp_path):
    with pytest.raises(FormatError, match="not a directory"):
        Store(tmp_path / "nothing")
    with pytest.raises(FormatError, match="not a fastfeed store"):
        Store(tmp_path)
    copy = tmp_path / "v2"
    copy.mkdir()
    m = json.loads((sample_store / "manifest.json").read_text())
    m["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="version 99 but this fastfeed reads version 1"):
        Store(copy)


def _flip_byte_in_record(store_dir, index):
    """Damage one byte inside record `index`'s payload, in the shard file itself."""
    store = Store(store_dir)
    rec = bytes(store.raw_record(index))
    shard = store_dir / store.shard_name(index)
    store.close()
    data = bytearray(shard.read_bytes())
    needle = rec[-3000:-2000]  # unique enough: compressed image bytes
    pos = data.find(needle)
    assert pos > 0 and data.find(needle, pos + 1) == -1
    data[pos + 500] ^= 0x5A
    shard.write_bytes(bytes(data))
    return store.shard_name(index)


def test_corrupted_byte_caught_by_verify_and_by_reads(sample_store, tmp_path):
    import shutil

    bad = tmp_path / "bad.ff"
    shutil.copytree(sample_store, bad)
    assert verify(bad, progress=False).ok
    shard = _flip_byte_in_record(bad, 7)
    res = verify(bad, decode=True, workers=2, progress=False)
    assert [(d["shard"], d["index"]) for d in res.damaged] == [(shard, 7)]
    assert "CRC32 mismatch" in res.damaged[0]["error"]
    store = Store(bad)
    with pytest.raises(RecordCorrupt, match=f"record 7 in shard {shard}: CRC32 mismatch"):
        store[7]
    store[6], store[8]  # neighbours still read
    assert Store(bad, check_crc=False).get(7, decode=False).data  # opting out of the check is possible


def test_verify_notices_a_missing_or_truncated_shard(sample_store, tmp_path):
    import shutil

    bad = tmp_path / "bad.ff"
    shutil.copytree(sample_store, bad)
    (bad / "shard-00001.mdb").unlink()
    res = verify(bad, progress=False)
    assert not res.ok and res.damaged[0]["error"].startswith("shard file shard-00001.mdb is missing (records ")


def test_summarize(sample_store):
    s = summarize(sample_store)
    assert s["images"] == 16 and s["boxes"] == 109 and s["crowd_boxes"] == 1 and s["shards"] == 3
    assert sum(c["boxes"] for c in s["classes"]) == 109
    assert sum(s["long_side_histogram"].values()) == 16 and s["bytes"] > 1_000_000
    person = s["classes"][0]
    assert person["name"] == "person" and person["source_id"] == 1 and person["boxes"] == 42


def test_truncated_shard_is_an_error_not_a_crash(sample_store, tmp_path):
    import os
    import shutil

    bad = tmp_path / "bad.ff"
    shutil.copytree(sample_store, bad)
    os.truncate(bad / "shard-00000.mdb", 100_000)
    with pytest.raises(FormatError, match="shard-00000.mdb .* truncated or replaced"):
        Store(bad)[0]
    res = verify(bad, progress=False)
    assert not res.ok and "truncated" in res.damaged[0]["error"]
