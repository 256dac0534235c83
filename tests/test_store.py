"""`Store` reads, integrity checks, and `verify` / `summarize`."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle

import numpy as np
import pytest
from store_helpers import flip_byte_in_record, replace_record, run_pack  # noqa: F401

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
    with pytest.raises(FormatError, match="nothing does not exist: not a fastfeed store"):
        Store(tmp_path / "nothing")
    with pytest.raises(FormatError, match="not a fastfeed store"):
        Store(tmp_path)
    copy = tmp_path / "v2"
    copy.mkdir()
    m = json.loads((sample_store / "manifest.json").read_text())
    m["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="version 99 but this fastfeed reads versions 1, 2, 3, 4: re-pack"):
        Store(copy)


def test_a_version_1_store_still_reads_upright(sample_store, tmp_path):
    """Version 1 wrote 0 where version 2 keeps the EXIF orientation: such records read as upright."""
    import shutil

    old = tmp_path / "v1.ff"
    shutil.copytree(sample_store, old)
    m = json.loads((old / "manifest.json").read_text())
    m["format_version"] = 1
    (old / "manifest.json").write_text(json.dumps(m))
    replace_record(old, 2, orientation=0)
    with Store(old) as v1, Store(sample_store) as v2:
        r = v1.record(2)
        assert r.orientation == 1 and np.array_equal(v1[2].image, v2[2].image)






def test_corrupted_byte_caught_by_verify_and_by_reads(sample_store, tmp_path):
    import shutil

    bad = tmp_path / "bad.ff"
    shutil.copytree(sample_store, bad)
    assert verify(bad, progress=False).ok
    shard = flip_byte_in_record(bad, 7)
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
    with pytest.raises(FormatError, match="shard shard-00001.mdb is missing from .*bad.ff"):
        Store(bad)[0]


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


def test_a_store_repacked_in_place_is_never_read_as_a_mix(tmp_path, coco_builder):
    """pack --force over a store a process holds: a Store opened afterwards reads the new pack; one that
    had read before keeps its old content; one opened before but first read after raises."""
    for k in range(4):
        coco_builder.add_image(f"{k}.jpg", 64, 96, seed=k, boxes=[(1, [4, 4, 20, 20])])
    src = coco_builder.write()
    out = tmp_path / "s.ff"
    run_pack(src, out, shards=2)
    with Store(out) as ref:
        old = [ref[i].image for i in range(4)]
    held, unread = Store(out), Store(out)
    held[3]   # maps every shard of the first pack
    for k in range(4):   # other pixels, same names and sizes
        coco_builder.add_image(f"{k}.jpg", 64, 96, seed=10 + k, write=True, boxes=[(1, [4, 4, 20, 20])])
    coco_builder.data["images"] = coco_builder.data["images"][4:]
    run_pack(coco_builder.write(), out, shards=2, overwrite=True)
    fresh = Store(out)
    assert all(not np.array_equal(fresh[i].image, old[i]) for i in range(4))
    assert all(np.array_equal(held[i].image, old[i]) for i in range(4))
    with pytest.raises(FormatError, match="was re-packed or removed after this Store was opened; open it again"):
        unread[0]
    held.close()
    fresh.close()


def test_a_store_whose_first_pack_is_running_says_so(tmp_path):
    from fastfeed.pack.writer import pack_lock

    out = tmp_path / "new.ff"
    with pack_lock(out):
        with pytest.raises(FormatError, match=r"new.ff is being packed right now \(fastfeed pack, pid \d+\): wait"):
            Store(out)
    with pytest.raises(FormatError, match="new.ff does not exist: not a fastfeed store"):   # nobody packing: the usual message
        Store(out)
