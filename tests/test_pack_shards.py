"""fastfeed pack: shards by count and size, parallel workers, and what a failed shard leaves."""

from __future__ import annotations

import pytest
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.pack import PackError

# --- sharding and parallelism ---------------------------------------------------------------------

def test_shards_by_count_and_size_read_back_in_order(coco_builder, tmp_path):
    for k in range(10):
        coco_builder.add_image(f"{k:02d}.jpg", seed=k, boxes=[(1, [k, k, 5, 5])])
    src = coco_builder.write()
    run_pack(src, tmp_path / "n", shards=3, workers=2)
    store = Store(tmp_path / "n")
    assert [(s.start, s.count) for s in store.shards] == [(0, 3), (3, 4), (7, 3)]
    assert [store[i].file_name for i in range(10)] == [f"{k:02d}.jpg" for k in range(10)]
    run_pack(src, tmp_path / "m", shard_mb=0.01)
    sized = Store(tmp_path / "m")
    assert len(sized.shards) > 1 and sum(s.count for s in sized.shards) == 10
    assert [sized[i].boxes.tolist() for i in range(10)] == [store[i].boxes.tolist() for i in range(10)]


def test_a_shard_whose_images_all_fail_leaves_no_gap(coco_builder, tmp_path):
    for k in range(9):
        coco_builder.add_image(f"{k}.jpg", seed=k, data=b"broken" if 3 <= k <= 5 else None)
    res = run_pack(coco_builder.write(), tmp_path / "out", shards=3, workers=2, allow_background_only=True)
    store = Store(tmp_path / "out")
    assert [s.file for s in store.shards] == ["shard-00000.mdb", "shard-00001.mdb"]
    assert [store[i].file_name for i in range(len(store))] == ["0.jpg", "1.jpg", "2.jpg", "6.jpg", "7.jpg", "8.jpg"]
    assert res.report.counts["corrupt_image"] == 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "manifest.json", "rejects.jsonl", "shard-00000.mdb", "shard-00001.mdb"]


def test_on_error_fail_in_parallel_stops_every_worker(coco_builder, tmp_path):
    for k in range(200):
        coco_builder.add_image(f"{k:03d}.jpg", 16, 16, seed=k, data=b"broken" if k == 7 else None)
    with pytest.raises(PackError, match="007.jpg: corrupt_image"):
        run_pack(coco_builder.write(), tmp_path / "out", workers=2, on_error="fail", shards=8, allow_background_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco"]
