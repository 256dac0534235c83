"""EXIF orientation end to end: photos stored turned, with each orientation 1..8 written by Pillow, and
boxes drawn on the upright image (as every labelling tool shows it). After `fastfeed pack` the box must
lie on the painted rectangle in the Store, the cpu, shm and dali loaders' batches and evaluation."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from conftest import CocoBuilder
from loader_checks import NO_COLOUR, assert_boxes_frame_paint, red_mask
from PIL import Image
from store_helpers import rejects, run_pack

from fastfeed import Store, exif
from fastfeed.loaders import LoaderConfig, create_loader

RED = (230, 20, 20)
H, W = 96, 160            # the upright image


def _upright(k: int):
    rng = np.random.default_rng(k)
    img = rng.integers(90, 160, (H, W, 3), dtype=np.uint8)
    x1, y1, bw, bh = 12 + 9 * k, 10 + 5 * k, 40, 30
    img[y1:y1 + bh, x1:x1 + bw] = RED
    return img, [x1, y1, bw, bh]


def _stored(upright: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels a camera writes so that `orientation` shows `upright`."""
    inverse = {6: 8, 8: 6}.get(orientation, orientation)
    return exif.apply_orientation(upright, inverse)


def _file(pixels: np.ndarray, orientation: int, fmt: str) -> bytes:
    tag = Image.Exif()
    tag[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, exif=tag.tobytes(), **({"quality": 97} if fmt == "JPEG" else {}))
    return buf.getvalue()


@pytest.fixture(scope="module")
def oriented_src(tmp_path_factory):
    """16 images: every orientation 1..8 as a JPEG and as a PNG, boxes in the upright frame."""
    b = CocoBuilder(tmp_path_factory.mktemp("exif") / "src")
    for k in range(16):
        o, fmt = k % 8 + 1, ("JPEG", "PNG")[k // 8]
        img, box = _upright(k % 8)
        data = _file(_stored(img, o), o, fmt)
        b.add_image(f"{k:02d}-o{o}.{fmt.lower()}", H, W, data=data, boxes=[(1, box)])   # COCO sizes: upright
    return b.write()


@pytest.fixture(scope="module")
def oriented_store(oriented_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("exif_store") / "s.ff"
    res = run_pack(oriented_src, out)
    assert res.report.images_rejected == 0
    assert res.report.counts["oriented"] == 14          # orientations 2..8, twice
    assert res.manifest.stats["oriented"] == 14 and res.manifest.pack_options["exif"] == "apply"
    return Store(out)


def test_the_store_reads_every_orientation_upright(oriented_store):
    for i in range(len(oriented_store)):
        r = oriented_store.record(i)
        img, box = _upright(i % 8)
        s = oriented_store[i]
        assert s.size == (H, W) == r.size and s.orig_size == (H, W)
        assert r.orientation == i % 8 + 1 and r.codec == ("jpeg" if i < 8 else "cv2")
        x1, y1, bw, bh = box
        np.testing.assert_allclose(s.boxes[0] * [W, H, W, H], [x1, y1, x1 + bw, y1 + bh], atol=1e-3)
        red = red_mask(torch.from_numpy(s.image).permute(2, 0, 1)[None])[0]
        assert red[y1 + 2:y1 + bh - 2, x1 + 2:x1 + bw - 2].all() and red.sum() < 1.2 * bw * bh, f"record {i}"


@pytest.mark.parametrize("name", ["cpu", "shm", "dali", "device"])
def test_loader_batches_put_the_boxes_on_the_paint(oriented_store, name, tmp_path):
    if name == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    options = {"cache_dir": str(tmp_path)} if name == "shm" else {}
    batches = []
    for augment in (False, True):   # letterboxed evaluation batches, then mosaic + affine + flips
        cfg = LoaderConfig(imgsz=128, batch_size=4, workers=0, augment=augment, hyp=NO_COLOUR, seed=2, device="cpu",
                           shuffle=augment, drop_last=False)
        with create_loader(name, oriented_store, cfg, **options) as loader:
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                batches += [(_uint8(b.images), b.targets.cpu().clone()) for b in loader]
    assert_boxes_frame_paint(batches, 128, min_boxes=16)


def _uint8(images: torch.Tensor) -> torch.Tensor:
    """The device loader's float [0,1] images as the other loaders' uint8."""
    images = images.cpu()
    return images.clone() if images.dtype == torch.uint8 else (images.float() * 255).round().to(torch.uint8)


def test_evaluation_maps_boxes_back_through_the_turned_frame(oriented_store):
    """Ground truth in original (upright) pixels; the loader's own letterboxed targets, mapped back through
    evaluation's frames, score mAP 1: the frame evaluate.py derives matches the turned decode."""
    from train_helpers import gt_as_detections

    from fastfeed.train import coco_map

    for imgsz in (64, 160):
        gt, dets = gt_as_detections(oriented_store, imgsz)
        assert {im["width"] for im in gt.imgs.values()} == {W}
        assert coco_map(gt, dets)["map"] == pytest.approx(1.0)


@pytest.mark.parametrize("store_mode", ["jpeg", "raw"])
def test_jpeg_and_raw_stores_hold_upright_pixels(oriented_src, tmp_path, store_mode):
    with Store(run_pack(oriented_src, tmp_path / "s.ff", store=store_mode).out) as st:
        for i in (5, 13):    # orientation 6, JPEG and PNG
            r = st.record(i)
            assert r.orientation == 1 and r.size == (H, W)
            img, (x1, y1, bw, bh) = _upright(i % 8)
            red = red_mask(torch.from_numpy(st[i].image).permute(2, 0, 1)[None])[0]
            assert red[y1 + 2:y1 + bh - 2, x1 + 2:x1 + bw - 2].all()


def test_exif_ignore_keeps_the_stored_frame_for_sets_annotated_on_raw_pixels(tmp_path):
    b = CocoBuilder(tmp_path / "src")
    raw, box = _upright(3)                                    # painted and boxed in the stored frame
    b.add_image("raw6.jpg", H, W, data=_file(raw, 6, "JPEG"), boxes=[(1, box)])
    res = run_pack(b.write(), tmp_path / "s.ff", exif="ignore")
    assert res.report.counts["orientation_ignored"] == 1 and res.manifest.stats["oriented"] == 0
    with Store(res.out) as st:
        s = st[0]
        assert st.record(0).orientation == 1 and s.size == (H, W)
        x1, y1, bw, bh = box
        assert red_mask(torch.from_numpy(s.image).permute(2, 0, 1)[None])[0][y1 + 2:y1 + bh - 2, x1 + 2:x1 + bw - 2].all()


def test_a_coco_size_of_the_other_frame_is_named(tmp_path):
    b = CocoBuilder(tmp_path / "src")
    img, box = _upright(1)
    b.add_image("turned.jpg", W, H, data=_file(_stored(img, 6), 6, "JPEG"), boxes=[(1, box)])   # JSON: stored frame
    out = tmp_path / "s.ff"
    with pytest.raises(Exception, match="nothing usable was packed"):
        run_pack(b.write(), out)
    (r,) = [r for r in rejects(out) if r["reason"] == "size_mismatch"]
    assert "EXIF orientation 6" in r["detail"] and "--exif ignore" in r["detail"]


def test_the_cli_takes_exif(tmp_path, oriented_src, capsys):
    from fastfeed.cli import main

    assert main(["pack", str(oriented_src), "-o", str(tmp_path / "a.ff"), "--exif", "ignore", "--quiet",
                 "--max-dropped", "1"]) == 0   # half its images (size_mismatch) are rejected
    assert "orientation_ignored" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "a.ff" / "manifest.json").read_text())
    assert manifest["pack_options"]["exif"] == "ignore" and manifest["format_version"] == 4
    with pytest.raises(SystemExit):
        main(["pack", str(oriented_src), "-o", str(tmp_path / "b.ff"), "--exif", "sideways"])


def test_a_coco_set_annotated_on_raw_pixels_stops_the_pack_and_exif_ignore_packs_it(tmp_path, capsys):
    """Orientations 2-4 keep their size when turned, so their JSON sizes cannot tell which frame the boxes are
    in; the 5-8 images of the same set can: when they show the raw frame, no image of it may pack upright (the
    2-4 ones would have their boxes mirrored): the pack stops, writes nothing, and names --exif ignore."""
    from fastfeed.cli import main

    b = CocoBuilder(tmp_path / "src")
    for k, o in enumerate((6, 8, 6, 3, 2, 1)):
        raw, box = _upright(k)                                # painted and boxed on the raw, stored pixels
        b.add_image(f"{k}-o{o}.jpg", H, W, data=_file(raw, o, "JPEG"), boxes=[(1, box)])   # JSON: the raw frame
    src, out = b.write(), tmp_path / "s.ff"
    assert main(["pack", str(src), "-o", str(out), "--quiet", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "instances_train2017.json was annotated on the raw pixels: 3 of the 3 images with EXIF orientation 5-8" in err
    assert "the boxes of its 2 image(s) with orientation 2-4" in err and "would be packed mirrored or upside down" in err
    assert "Nothing was written; pack with --exif ignore" in err and not out.exists()
    assert main(["pack", str(src), "-o", str(out), "--quiet", "--workers", "1", "--exif", "ignore"]) == 0
    with Store(out) as st:                                   # what it says to do: every image, boxes on the paint
        assert len(st) == 6 and st.manifest.report["errors"] == {}
        for i in range(len(st)):
            s, k = st[i], int(st[i].file_name[0])
            _, (x1, y1, bw, bh) = _upright(k)
            red = red_mask(torch.from_numpy(s.image).permute(2, 0, 1)[None])[0]
            assert red[y1 + 2:y1 + bh - 2, x1 + 2:x1 + bw - 2].all(), s.file_name
    assert main(["pack", str(src), "-o", str(out), "--quiet", "--workers", "1", "--force"]) == 1   # over a store:
    assert Store(out).manifest.pack_options["exif"] == "ignore"                                 # left as it was


def test_only_mirrored_or_upside_down_images_pack_and_the_note_says_when_exif_ignore_is_right(tmp_path, capsys):
    """With only orientations 2-4 nothing tells the frame: the set packs upright, as labelling tools show it, and
    the note says so plainly."""
    from fastfeed.cli import main

    b = CocoBuilder(tmp_path / "src")
    for k, o in enumerate((3, 2, 1)):
        img, box = _upright(k)
        b.add_image(f"{k}-o{o}.jpg", H, W, data=_file(_stored(img, o), o, "JPEG"), boxes=[(1, box)])
    assert main(["pack", str(b.write()), "-o", str(tmp_path / "s.ff"), "--quiet", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "note       2  oriented:" in out and "EXIF orientation 3 (upside down, the same size in both frames)" in out
    assert "its boxes were taken in the upright frame" in out and "drawn on the raw, unturned pixels" in out
    assert "pack with --exif ignore" in out


def test_a_set_annotated_upright_with_a_few_stray_raw_sizes_is_not_called_raw(tmp_path):
    b = CocoBuilder(tmp_path / "src")
    for k, o in enumerate((6, 8, 6, 3)):
        img, box = _upright(k)
        h, w = (W, H) if k == 0 else (H, W)                   # one JSON size of the raw frame, the rest upright
        b.add_image(f"{k}-o{o}.jpg", h, w, data=_file(_stored(img, o), o, "JPEG"), boxes=[(1, box)])
    res = run_pack(b.write(), tmp_path / "s.ff")
    assert res.report.counts["size_mismatch"] == 1 and "annotated_raw" not in res.report.counts
