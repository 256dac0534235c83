"""Inputs users bring (issue #11): every image packs right or is rejected by name, and no one file
stops the pack. Each case is a generated file; see docs/inputs.md for the table these check."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import image_bytes, jpeg_bytes, paint_image, png_claiming
from store_helpers import by_name, rejects, run_pack

from fastfeed import Store
from fastfeed.pack import PackError, process
from fastfeed.store import format as fmt

# --- COCO JSON edited by hand ----------------------------------------------------------------------


def test_duplicate_image_ids_reject_every_image_of_the_id_by_name(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", seed=1, boxes=[(1, [10, 10, 20, 20])])
    b.add_image("b.jpg", seed=2, boxes=[(3, [30, 30, 20, 20])])
    b.add_image("c.jpg", seed=3, boxes=[(18, [5, 5, 40, 40])])
    b.data["images"][1]["id"] = 1            # b.jpg now shares a.jpg's id: whose boxes are whose?
    for a in b.data["annotations"]:
        a["image_id"] = 1 if a["image_id"] == 2 else a["image_id"]
    res = run_pack(b.write(), tmp_path / "out")
    store = Store(tmp_path / "out")
    assert [store[i].file_name for i in range(len(store))] == ["c.jpg"]
    np.testing.assert_allclose(store[0].boxes, [[5 / 160, 5 / 120, 45 / 160, 45 / 120]], atol=1e-6)
    got = {(r["file"], r["reason"], r["kind"]) for r in rejects(tmp_path / "out")}
    assert got == {("a.jpg", "duplicate_image_id", "image"), ("b.jpg", "duplicate_image_id", "image")}
    detail = rejects(tmp_path / "out")[0]["detail"]
    assert "image id 1" in detail and "a.jpg, b.jpg" in detail and "2 annotation(s)" in detail
    assert res.report.counts["orphan_annotation"] == 0 and res.report.images_rejected == 2


def test_one_file_listed_twice_is_rejected_not_packed_twice_with_half_its_boxes(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", seed=1, boxes=[(1, [10, 10, 20, 20])])
    b.add_image("a.jpg", seed=1, boxes=[(3, [60, 60, 20, 20])])   # same file, second id, other boxes
    b.add_image("ok.jpg", seed=2, boxes=[(3, [60, 60, 20, 20])])
    res = run_pack(b.write(), tmp_path / "out")
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["ok.jpg"]
    rows = rejects(tmp_path / "out")
    assert [(r["file"], r["reason"]) for r in rows] == [("a.jpg", "duplicate_file_name")] * 2
    assert "ids 1, 2" in rows[0]["detail"] and res.report.counts["unlisted_image"] == 0


def test_annotation_with_a_list_for_image_id_is_malformed_not_a_crash(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco_builder.data["annotations"].append({"id": 9, "image_id": [1], "category_id": 1, "bbox": [1, 1, 2, 2]})
    res = run_pack(coco_builder.write(), tmp_path / "out")
    assert res.report.counts["malformed_annotation"] == 1 and len(Store(tmp_path / "out")) == 1


def test_a_list_for_category_id_or_a_null_byte_in_file_name_is_named_not_a_crash(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5]), ([1], [1, 1, 2, 2])])   # a list: unhashable
    coco_builder.add_image("b.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco_builder.data["images"][1]["file_name"] = "b.jpg\0"   # os.stat raises ValueError, not OSError
    res = run_pack(coco_builder.write(), tmp_path / "out")
    assert res.report.counts["unknown_category"] == 1 and res.report.counts["malformed_annotation"] == 1
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["a.jpg"]


def test_a_string_image_id_is_one_rejection_naming_the_id_not_also_an_unlisted_image(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", seed=1, boxes=[(1, [10, 10, 20, 20])])
    b.add_image("b.jpg", seed=2, boxes=[(1, [10, 10, 20, 20]), (3, [30, 30, 20, 20])])
    b.data["images"][1]["id"] = "2"            # an exporter that writes its ids as strings
    for a in b.data["annotations"][1:]:
        a["image_id"] = "2"
    res = run_pack(b.write(), tmp_path / "out")
    rows = rejects(tmp_path / "out")
    assert [(r["file"], r["reason"]) for r in rows] == [("b.jpg", "malformed_annotation")]
    assert "image id '2' is not an integer" in rows[0]["detail"] and "must be integers" in rows[0]["detail"]
    assert "its 2 annotation(s) dropped" in rows[0]["detail"] and res.report.counts["unlisted_image"] == 0
    assert list(by_name(Store(tmp_path / "out"))) == ["a.jpg"]


def test_a_windows_file_name_with_backslashes_packs_the_file_under_forward_slashes(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", seed=1, boxes=[(1, [10, 10, 20, 20])])
    (b.images_dir / "sub").mkdir()
    b.add_image("sub/c.jpg", seed=2, boxes=[(3, [30, 30, 20, 20])])
    b.data["images"][1]["file_name"] = "sub\\c.jpg"   # written on Windows
    res = run_pack(b.write(), tmp_path / "out")
    names = by_name(Store(tmp_path / "out"))
    assert sorted(names) == ["a.jpg", "sub/c.jpg"] and not res.report.errors and not res.report.counts["unlisted_image"]
    np.testing.assert_allclose(names["sub/c.jpg"].boxes, [[30 / 160, 30 / 120, 50 / 160, 50 / 120]], atol=1e-6)


# --- one bad file is that file's rejection ---------------------------------------------------------


def test_empty_truncated_and_bomb_files_are_rejected_each_by_name(coco_builder, tmp_path):
    b = coco_builder
    png = image_bytes(paint_image(120, 160, seed=5), "png")
    tif = image_bytes(paint_image(120, 160, seed=6), "tif")
    b.add_image("good.jpg", boxes=[(1, [1, 1, 10, 10])])
    b.add_image("empty.jpg", data=b"")                       # a 0-byte file ended the whole pack with cv2.error
    b.add_image("empty.png", data=b"")
    b.add_image("cut.png", data=png[: len(png) // 2])
    b.add_image("cut.tif", data=tif[:200])
    b.add_image("bomb.png", 100_000, 100_000, data=png_claiming(100_000, 100_000))
    res = run_pack(b.write(), tmp_path / "out", workers=2)
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["good.jpg"]
    got = {r["file"]: (r["reason"], r["detail"]) for r in rejects(tmp_path / "out")}
    assert {k: v[0] for k, v in got.items()} == {
        "empty.jpg": "corrupt_image", "empty.png": "corrupt_image", "cut.png": "corrupt_image",
        "cut.tif": "corrupt_image", "bomb.png": "image_too_large"}
    assert got["empty.jpg"][1] == "DecodeError: empty file (0 bytes)"
    assert "100000x100000 = 10000.0 MP (from the header, not decoded)" in got["bomb.png"][1]
    assert res.report.images_rejected == 5


def test_a_truncated_bmp_or_ppm_is_named_without_opencv_error_lines_on_stderr(coco_builder, tmp_path, capfd):
    import cv2

    level = cv2.utils.logging.getLogLevel()
    coco_builder.add_image("ok.jpg", boxes=[(1, [1, 1, 20, 20])])
    for ext in ("bmp", "ppm"):
        data = image_bytes(paint_image(120, 160, seed=3), ext)
        coco_builder.add_image(f"t.{ext}", data=data[: len(data) // 2], boxes=[(1, [1, 1, 20, 20])])
    run_pack(coco_builder.write(), tmp_path / "out")
    assert {(r["file"], r["reason"]) for r in rejects(tmp_path / "out")} == {("t.bmp", "corrupt_image"),
                                                                            ("t.ppm", "corrupt_image")}
    err = capfd.readouterr().err
    assert "imdecode" not in err and "[ERROR" not in err, err
    assert cv2.utils.logging.getLogLevel() == level   # OpenCV's logging as it was, outside the check


def test_max_pixels_refuses_from_the_header_and_can_be_raised(coco_builder, tmp_path):
    coco_builder.add_image("big.jpg", 120, 160, boxes=[(1, [1, 1, 10, 10])])
    coco_builder.add_image("small.png", 40, 50, data=image_bytes(paint_image(40, 50), "png"),
                              boxes=[(1, [1, 1, 10, 10])])
    src = coco_builder.write()
    res = run_pack(src, tmp_path / "a", max_pixels=160 * 120 - 1)
    assert [s.file_name for s in by_name(Store(tmp_path / "a")).values()] == ["small.png"]
    assert res.report.counts["image_too_large"] == 1 and "--max-pixels 19199" in rejects(tmp_path / "a")[0]["detail"]
    assert res.manifest.pack_options["max_pixels"] == 19199
    assert len(Store(run_pack(src, tmp_path / "b", max_pixels=160 * 120).out)) == 2
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        run_pack(src, tmp_path / "c", max_pixels=0)


@pytest.mark.parametrize("exc, reason", [(RuntimeError("boom"), "check_failed"), (MemoryError("no room"), "image_too_large")])
def test_any_exception_on_one_file_rejects_that_file_with_its_type(coco_builder, tmp_path, monkeypatch, exc, reason):
    coco_builder.add_image("a.jpg", seed=1, boxes=[(1, [1, 1, 10, 10])])
    coco_builder.add_image("odd.png", data=image_bytes(paint_image(120, 160), "png"))
    real = process.formats.header_size

    def header_size(data, fmt):
        if fmt == "png":
            raise exc
        return real(data, fmt)

    monkeypatch.setattr(process.formats, "header_size", header_size)
    run_pack(coco_builder.write(), tmp_path / "out")
    assert len(Store(tmp_path / "out")) == 1
    assert [(r["file"], r["reason"], r["detail"]) for r in rejects(tmp_path / "out")] == [
        ("odd.png", reason, f"{type(exc).__name__}: {exc}")]


def test_a_bug_outside_the_image_check_still_surfaces(coco_builder, tmp_path, monkeypatch):
    """The catch-all covers reading the image only: a bug in box handling is not hidden as a rejection."""
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 10, 10])])
    monkeypatch.setattr("fastfeed.pack.process._clean_boxes", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_pack(coco_builder.write(), tmp_path / "out")


def test_decoded_pixels_of_a_good_jpeg_are_unchanged_by_the_check(coco_builder, tmp_path):
    data = jpeg_bytes(paint_image(64, 64, seed=9))
    coco_builder.add_image("a.jpg", 64, 64, data=data)
    run_pack(coco_builder.write(), tmp_path / "out", allow_background_only=True)
    assert Store(tmp_path / "out").get(0, decode=False).data == data


# --- folders and label files ------------------------------------------------------------------------


def test_images_under_a_linked_folder_are_packed_and_a_link_loop_ends(yolo_builder, tmp_path):
    b = yolo_builder(names=["a", "b"])
    (b.images_dir / "real").mkdir()
    (b.labels_dir / "real").mkdir()
    b.add("real/one", ["0 0.5 0.5 0.2 0.2"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "two.jpg").write_bytes(jpeg_bytes(paint_image(100, 140, seed=3)))
    (b.images_dir / "linked").symlink_to(elsewhere, target_is_directory=True)
    (b.labels_dir / "linked").mkdir()
    (b.labels_dir / "linked" / "two.txt").write_text("1 0.5 0.5 0.4 0.4\n")
    (b.images_dir / "real" / "loop").symlink_to(b.images_dir, target_is_directory=True)   # points back up
    res = run_pack(b.root, tmp_path / "out")
    got = by_name(Store(tmp_path / "out"))
    assert sorted(got) == ["linked/two.jpg", "real/one.jpg"]
    np.testing.assert_allclose(got["linked/two.jpg"].boxes, [[0.3, 0.3, 0.7, 0.7]], atol=1e-6)
    assert res.report.counts["label_without_image"] == 0 and res.report.errors == []
    assert res.report.examples["repeated_folder"][0].startswith("real/loop: repeated_folder")


def test_labels_under_a_linked_folder_are_found(yolo_builder, tmp_path):
    b = yolo_builder(names=["a"]).add("x", None)
    shared = tmp_path / "shared_labels"
    shared.mkdir()
    (shared / "y.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (b.images_dir / "sub").mkdir()
    (b.images_dir / "sub" / "y.jpg").write_bytes(jpeg_bytes(paint_image(50, 50)))
    (b.labels_dir / "sub").symlink_to(shared, target_is_directory=True)
    res = run_pack(b.root, tmp_path / "out")
    assert len(by_name(Store(tmp_path / "out"))["sub/y.jpg"].boxes) == 1 and res.report.counts["background"] == 1


def test_a_label_file_with_a_byte_order_mark_keeps_its_first_box(yolo_builder, tmp_path):
    b = yolo_builder(names=["a", "b"]).add("img", None)
    (b.labels_dir / "img.txt").write_bytes("\ufeff1 0.5 0.5 0.2 0.2\r\n0 0.25 0.25 0.1 0.1\r\n".encode())
    res = run_pack(b.root, tmp_path / "out")
    s = Store(tmp_path / "out")[0]
    assert s.classes.tolist() == [1, 0] and res.report.errors == []
    np.testing.assert_allclose(s.boxes[0], [0.4, 0.4, 0.6, 0.6], atol=1e-6)


def test_hidden_files_and_folders_are_not_listed(yolo_builder, tmp_path):
    b = yolo_builder(names=["a"]).add("a", ["0 0.5 0.5 0.2 0.2"])
    (b.images_dir / "._a.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")
    (b.labels_dir / "._a.txt").write_bytes(b"\x00\x05\x16\x07")
    (b.images_dir / ".ipynb_checkpoints").mkdir()
    (b.images_dir / ".ipynb_checkpoints" / "a-checkpoint.jpg").write_bytes(jpeg_bytes(paint_image(10, 10)))
    res = run_pack(b.root, tmp_path / "out")
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["a.jpg"] and res.report.errors == []


# --- two packs into one OUT -------------------------------------------------------------------------


def _hold_lock(out, ready, release):
    from fastfeed.pack.writer import pack_lock

    with pack_lock(out):
        ready.set()
        release.wait(30)


@pytest.fixture
def lock_held_elsewhere():
    """Hold OUT's pack lock in another process, as a first pack still running would."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = []

    def hold(out):
        ready, release = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_hold_lock, args=(out, ready, release))
        p.start()
        assert ready.wait(10)
        procs.append((p, release))
        return p.pid

    yield hold
    for p, release in procs:
        release.set()
        p.join(10)


def test_a_second_pack_into_one_out_stops_before_any_work(coco_builder, tmp_path, monkeypatch, lock_held_elsewhere):
    coco_builder.add_image("a.jpg")
    src = coco_builder.write()
    pid = lock_held_elsewhere(tmp_path / "out")
    assert fmt.pack_lock_path(tmp_path / "out") == tmp_path / ".out.lock"
    monkeypatch.setattr("fastfeed.pack.run.open_source", lambda *a: pytest.fail("the source was read"))
    with pytest.raises(PackError, match=f"another fastfeed pack \\(pid {pid}\\) is writing .*out: wait for it"):
        run_pack(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cli_says_so_in_one_line(coco_builder, tmp_path, capsys, lock_held_elsewhere):
    from fastfeed.cli import main

    coco_builder.add_image("a.jpg")
    src = coco_builder.write()
    lock_held_elsewhere(tmp_path / "out")
    assert main(["pack", str(src), "-o", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fastfeed: error: another fastfeed pack (pid ")


def test_the_lock_goes_with_the_pack_and_a_stale_one_is_no_obstacle(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg")
    src = coco_builder.write()
    (tmp_path / ".out.lock").write_text("99999999\n")                 # left by a killed pack: nobody holds it
    (tmp_path / ".out.incomplete-99999999").mkdir()                   # that pack's half-written store
    run_pack(src, tmp_path / "out", allow_background_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco", "out"]


# --- messages ---------------------------------------------------------------------------------------


def test_the_cli_points_at_rejects_jsonl_only_where_it_exists(coco_builder, tmp_path, capsys):
    from fastfeed.cli import main

    coco_builder.add_image("bad.jpg", data=b"")
    src = coco_builder.write()
    assert main(["pack", "--allow-background-only", str(src), "-o", str(tmp_path / "out"), "--quiet", "--on-error", "fail"]) == 1
    out, err = capsys.readouterr()
    assert "rejects.jsonl" not in out + err and not (tmp_path / "out").exists()
    assert main(["pack", "--allow-background-only", str(src), "-o", str(tmp_path / "out"), "--quiet"]) == 1
    out, err = capsys.readouterr()
    listed = tmp_path / "out" / "rejects.jsonl"
    assert f"errors are listed in {listed}" in out and f"the reasons are listed in {listed}" in err
    assert rejects(tmp_path / "out")[0]["file"] == "bad.jpg"


def test_verify_names_the_missing_shard(coco_builder, tmp_path, capsys):
    from fastfeed.cli import main

    for k in range(4):
        coco_builder.add_image(f"{k}.jpg", seed=k)
    run_pack(coco_builder.write(), tmp_path / "out", shards=2, allow_background_only=True)
    (tmp_path / "out" / "shard-00001.mdb").unlink()
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 1
    assert "shard file shard-00001.mdb is missing (records 2..3)" in capsys.readouterr().out


def test_max_pixels_is_explained_in_help_with_the_default_it_applies(capsys):
    from PIL import Image

    from fastfeed.cli import main

    assert process.DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS

    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    assert f"default {process.DEFAULT_MAX_PIXELS:,}, Pillow's decompression-bomb limit" in " ".join(
        capsys.readouterr().out.split())


def test_an_unreadable_label_file_skips_its_image_rather_than_packing_it_without_boxes(yolo_builder, tmp_path):
    b = yolo_builder(names=["café"]).add("ok", ["0 0.5 0.5 0.2 0.2"]).add("latin", None)
    (b.labels_dir / "latin.txt").write_bytes("0 0.5 0.5 0.2 0.2 # caf\xe9\n".encode("latin-1"))
    res = run_pack(b.root, tmp_path / "out")
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["ok.jpg"]
    (row,) = rejects(tmp_path / "out")
    assert (row["file"], row["reason"], row["kind"]) == ("latin.jpg", "unreadable_label", "image")
    assert "UnicodeDecodeError" in row["detail"] and "save it as UTF-8" in row["detail"]
    assert res.report.counts["background"] == 0


def test_docs_inputs_md_covers_every_reason():
    from conftest import REPO

    from fastfeed.pack import report

    page = (REPO / "docs" / "inputs.md").read_text()
    missing = [r for r in (*report.ERRORS, *report.NOTES) if f"`{r}`" not in page]
    assert missing == [], f"docs/inputs.md does not say which input leads to {missing}"


def test_a_set_of_only_unlisted_formats_still_lists_its_reasons(yolo_builder, tmp_path):
    from PIL import Image

    b = yolo_builder(names=["a"]).add("anim", ["0 0.5 0.5 0.2 0.2"], image=False)
    Image.fromarray(paint_image(16, 16)).save(b.images_dir / "anim.gif")
    with pytest.raises(PackError, match="nothing usable was packed: no image could be listed") as e:
        run_pack(b.root, tmp_path / "out")
    assert [(r["file"], r["reason"]) for r in rejects(tmp_path / "out")] == [("anim.gif", "unsupported_format")]
    assert e.value.rejects == tmp_path / "out" / "rejects.jsonl"


def test_verify_lists_a_damaged_record_without_advising_to_run_verify(coco_builder, tmp_path, capsys):
    from store_helpers import flip_byte_in_record

    from fastfeed.cli import main

    for k in range(3):
        coco_builder.add_image(f"{k}.jpg", seed=k)
    run_pack(coco_builder.write(), tmp_path / "out", allow_background_only=True)
    flip_byte_in_record(tmp_path / "out", 1)
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "1 damaged record(s)" in out and "record 1" in out and "re-pack" in out and "fastfeed verify" not in out
