"""fastfeed pack with every image format Ultralytics reads: packed as is, transcoded, or rejected by name."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IMAGE_EXTENSIONS, image_bytes, paint_image
from store_helpers import by_name, rejects, run_pack

from fastfeed import Store

# --- image formats ----------------------------------------------------------------------------------

_LOSSLESS = {"png", "bmp", "tif", "tiff", "webp", "jp2", "pfm"}
_TRANSCODED = {"pfm", "avif", "heic", "heif", "dng"}


def _every_format(b, img):
    for ext in IMAGE_EXTENSIONS:
        b.add(f"img_{ext}", ["1 0.5 0.5 0.5 0.25"], ext=f".{ext}", data=image_bytes(img, ext))
    return b.root


@pytest.fixture
def every_format_store(yolo_builder, tmp_path):
    """Every extension Ultralytics accepts, one image each, packed (original payloads)."""
    img = paint_image(48, 64, seed=7)
    res = run_pack(_every_format(yolo_builder(names=["a", "b"]), img), tmp_path / "out", workers=2)
    return img, res, Store(tmp_path / "out")


def test_every_extension_ultralytics_accepts_is_packed_with_its_boxes(every_format_store):
    img, res, store = every_format_store
    got = by_name(store)
    index = {store[i].file_name: i for i in range(len(store))}
    assert sorted(got) == sorted(f"img_{ext}.{ext}" for ext in IMAGE_EXTENSIONS)
    assert res.report.errors == [] and res.report.counts["transcoded"] == len(_TRANSCODED)
    for ext in IMAGE_EXTENSIONS:
        s = got[f"img_{ext}.{ext}"]
        np.testing.assert_allclose(s.boxes, [[0.25, 0.375, 0.75, 0.625]], atol=1e-6)
        assert s.classes.tolist() == [1] and s.image.shape == (48, 64, 3)
        assert s.codec == ("jpeg" if ext in ("jpg", "jpeg", "jpe", "mpo") else "cv2"), ext
        if ext in _TRANSCODED:
            assert bytes(store.get(index[s.file_name], decode=False).data[:4]) == b"\x89PNG", ext
        if ext in _LOSSLESS:
            assert np.array_equal(s.image, img), ext
        elif ext != "dng":  # lossy formats: the same picture
            assert np.abs(s.image.astype(int) - img).mean() < 4, ext
    notes = {p.split(":")[0]: p for p in res.report.examples["transcoded"]}
    assert "heif decoded by Pillow, stored as PNG" in notes["img_heic.heic"]
    assert "dng decoded by rawpy" in notes["img_dng.dng"]


def test_every_stored_payload_decodes_with_dali(every_format_store):
    """A record may hold only what fastfeed.codec and DALI's image decoder both read."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1, exec_async=False,
                  exec_pipelined=False)
    def decode():
        data = fn.external_source(name="data", dtype=types.UINT8, ndim=1)
        return fn.decoders.image(data, device="cpu", output_type=types.RGB, adjust_orientation=False)

    _, _, store = every_format_store
    pipe = decode()
    pipe.build()
    for i in range(len(store)):
        payload = np.frombuffer(bytes(store.get(i, decode=False).data), np.uint8)
        pipe.feed_input("data", [payload])
        (out,) = pipe.run()
        dali = np.array(out[0])
        assert dali.shape == store[i].image.shape, store[i].file_name
        assert np.abs(dali.astype(int) - store[i].image).max() <= 1, store[i].file_name


@pytest.fixture
def no_heif_plugin(monkeypatch):
    """As if pillow-heif were not installed, even where an earlier test registered it."""
    from PIL import Image

    from fastfeed import formats

    monkeypatch.setitem(__import__("sys").modules, "pillow_heif", None)
    monkeypatch.setattr(Image, "ID", [i for i in Image.ID if i != "HEIF"])
    formats._register_plugin.cache_clear()
    yield
    formats._register_plugin.cache_clear()


def test_heic_without_its_plugin_is_unsupported_format_naming_the_package(yolo_builder, tmp_path, request):
    img = paint_image(48, 64, seed=1)
    b = yolo_builder(names=["a"]).add("phone", ["0 0.5 0.5 0.2 0.2"], ext=".heic", data=image_bytes(img, "heic"))
    b.add("ok", ["0 0.5 0.5 0.2 0.2"])
    request.getfixturevalue("no_heif_plugin")
    res = run_pack(b.root, tmp_path / "out")
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["ok.jpg"]
    (row,) = rejects(tmp_path / "out")
    assert (row["file"], row["reason"], row["kind"]) == ("phone.heic", "unsupported_format", "image")
    assert "pip install -e '.[heic]'" in row["detail"] and res.report.counts["label_without_image"] == 0


def test_transcoded_formats_follow_the_store_mode(yolo_builder, tmp_path):
    img = paint_image(60, 80, seed=2)
    b = yolo_builder(names=["a"]).add("phone", ["0 0.5 0.5 0.2 0.2"], ext=".heic", data=image_bytes(img, "heic"))
    res = run_pack(b.root, tmp_path / "out", store="jpeg", max_side=40)
    s = Store(tmp_path / "out")[0]
    assert s.codec == "jpeg" and s.size == (30, 40) and s.orig_size == (60, 80)
    assert res.report.examples["transcoded"] == ["phone.heic: transcoded (heif decoded by Pillow)"]


def test_an_image_under_an_extension_not_listed_is_named_not_a_label_without_image(yolo_builder, tmp_path):
    from PIL import Image

    b = yolo_builder(names=["a"]).add("ok", ["0 0.5 0.5 0.2 0.2"])
    Image.fromarray(paint_image(32, 32)).save(b.images_dir / "anim.gif")
    b.add("anim", ["0 0.5 0.5 0.2 0.2"], image=False)
    b.add("lonely", ["0 0.5 0.5 0.2 0.2"], image=False)
    res = run_pack(b.root, tmp_path / "out")
    got = {(r["file"], r["reason"]) for r in rejects(tmp_path / "out")}
    assert got == {("anim.gif", "unsupported_format"), ("lonely.txt", "label_without_image")}
    assert "convert the image to PNG or JPEG" in res.report.examples["unsupported_format"][0]


def test_a_gif_named_in_a_coco_json_is_transcoded(coco_builder, tmp_path):
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(paint_image(40, 50)).save(buf, "GIF")
    coco_builder.add_image("a.gif", 40, 50, data=buf.getvalue(), boxes=[(1, [1, 1, 10, 10])])
    res = run_pack(coco_builder.write(), tmp_path / "out")
    assert Store(tmp_path / "out")[0].codec == "cv2" and res.report.counts["transcoded"] == 1


def test_float_tiff_and_hdr_pfm_are_unsupported_with_what_to_do(coco_builder, tmp_path):
    import cv2

    coco_builder.add_image("f.tif", 8, 8, data=cv2.imencode(".tiff", np.zeros((8, 8, 3), np.float32))[1].tobytes())
    coco_builder.add_image("hdr.pfm", 8, 8, data=cv2.imencode(".pfm", np.full((8, 8, 3), 3.0, np.float32))[1].tobytes())
    coco_builder.add_image("ok.jpg")
    run_pack(coco_builder.write(), tmp_path / "out", allow_background_only=True)
    got = {r["file"]: (r["reason"], r["detail"]) for r in rejects(tmp_path / "out")}
    assert got["f.tif"][0] == got["hdr.pfm"][0] == "unsupported_format"
    assert "32-bit float TIFF" in got["f.tif"][1] and "convert it to an 8- or 16-bit PNG" in got["hdr.pfm"][1]
