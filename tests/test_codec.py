"""Decoding: the cheap pack-time check fails on exactly what a full decode fails on."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from conftest import IMAGE_EXTENSIONS, dng_bytes, image_bytes, jpeg_bytes, paint_image, png_claiming
from PIL import Image

from fastfeed import codec, exif, formats


@pytest.fixture(scope="module")
def jpegs(sample_dir):
    return [p.read_bytes() for p in sorted((sample_dir / "images" / "train2017").glob("*.jpg"))]


def _corrupt(data: bytes, rng, kind: int) -> bytes:
    d = bytearray(data)
    if kind == 0:  # truncated anywhere after the headers
        return bytes(d[: rng.integers(700, len(d))])
    if kind == 1:  # a few random bytes changed in the entropy-coded data
        for _ in range(rng.integers(1, 5)):
            d[rng.integers(700, len(d) - 2)] = rng.integers(256)
        return bytes(d)
    a = rng.integers(700, len(d) - 200)
    if kind == 2:  # a run zeroed (a bad disk block)
        n = int(rng.integers(1, 200))
        d[a:a + n] = b"\x00" * n
        return bytes(d)
    del d[a:a + rng.integers(1, 50)]  # bytes lost
    return bytes(d)


def _passes(data, full):
    try:
        codec.check_decodable(data, full=full)
        return True
    except codec.DecodeError:
        return False


def test_entropy_check_agrees_with_full_decode_on_corrupted_real_jpegs(jpegs):
    rng = np.random.default_rng(1)
    detected = 0
    for trial in range(400):
        bad = _corrupt(jpegs[trial % len(jpegs)], rng, trial % 4)
        full = _passes(bad, full=True)
        assert _passes(bad, full=False) == full, f"trial {trial}: the 1/8-scale check disagrees with a full decode"
        detected += not full
    assert detected > 200  # the corruptions are real: most are caught by both


def test_check_returns_the_original_size_and_codec(jpegs):
    size, how = codec.check_decodable(jpegs[0])
    assert how == "jpeg" and size == codec.decode_jpeg(jpegs[0]).shape[:2]


def test_decode_fit_uses_dct_scaling_and_never_enlarges(jpegs):
    img, orig, how = codec.decode_fit(jpegs[0], 160)
    assert max(img.shape[:2]) == 160 and how == "jpeg" and max(orig) == 640
    img, orig, _ = codec.decode_fit(jpegs[0], 4000)
    assert img.shape[:2] == orig


def test_unknown_bytes_raise_decode_error():
    with pytest.raises(codec.DecodeError, match="OpenCV could not decode"):
        codec.decode_any(b"definitely not an image")
    assert codec.sniff(b"GIF89a") == "other"


def _tagged(img, fmt: str, orientation: int) -> bytes:
    import io

    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    extra = {"quality": 95} if fmt == "JPEG" else {"lossless": True} if fmt == "WEBP" else {}
    Image.fromarray(img).save(buf, fmt, exif=exif.tobytes(), **extra)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
def test_exif_orientation_is_read_and_applied_in_one_place(fmt):
    """Every orientation 1..8 in every container that carries one: the tag is read from the header, and
    decode_payload turns the pixels into the upright frame (--exif apply) or keeps the stored frame
    (--exif ignore), TIFF included (OpenCV turns TIFFs itself). Pillow's exif_transpose agrees."""
    import io

    from PIL import Image, ImageOps

    img = np.zeros((30, 50, 3), np.uint8)
    img[3:9, 5:20] = (255, 0, 0)
    img[20:28, 30:45] = (0, 255, 0)
    kind = "jpeg" if fmt == "JPEG" else "cv2"
    for o in range(1, 9):
        data = _tagged(img, fmt, o)
        tag = exif.exif_orientation(data)
        assert tag == o
        for apply in (True, False):
            want = exif.apply_orientation(img, o) if apply else img
            got = codec.decode_payload(kind, data, want.shape[:2], orientation=exif.payload_orientation(data, tag, apply))
            assert got.shape == want.shape
            diff = np.abs(got.astype(int) - want)
            assert (diff.mean() < 8) if fmt == "JPEG" else (diff.max() == 0), (o, apply)
        if fmt != "TIFF":   # Pillow's own answer for the upright frame
            pil = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
            assert pil.shape == exif.apply_orientation(img, o).shape


def test_orientation_edge_cases_and_dct_sizes_in_the_turned_frame():
    assert exif.exif_orientation(b"") == 1 and exif.exif_orientation(b"not an image at all") == 1
    data = jpeg_bytes(paint_image(40, 80))                      # no EXIF at all
    assert exif.exif_orientation(data) == 1
    broken = data[:2] + b"\xff\xe1\x00\x10Exif\x00\x00II*\x00\xff\xff" + data[2:]   # an APP1 that lies
    assert exif.exif_orientation(broken) == 1
    with pytest.raises(ValueError, match="EXIF orientation must be 1..8"):
        exif.apply_orientation(np.zeros((2, 2, 3), np.uint8), 9)
    big = jpeg_bytes(paint_image(480, 640))                     # stored 480x640, shown upright as 640x480
    for o in (1, 6):
        size = exif.oriented_size(480, 640, o)
        want = codec.fit_size(*size, 200)                        # what a tile of long side 200 needs
        got = codec.decode_payload("jpeg", big, size, want, orientation=o)
        assert got.shape[:2] == exif.oriented_size(*codec.dct_size(480, 640, exif.oriented_size(*want, o)), o)
        assert got.shape[0] >= want[0] and got.shape[1] >= want[1] and max(got.shape[:2]) < 320


# --- formats beyond the fast path (fastfeed/formats.py) -------------------------------------------

_CONTAINER = {"jpg": "jpeg", "jpeg": "jpeg", "jpe": "jpeg", "mpo": "jpeg", "tif": "tiff", "heic": "heif"}


def test_empty_input_is_a_decode_error_not_a_cv2_error():
    for fn in (codec.decode_cv2, codec.check_decodable, codec.decode_any):
        with pytest.raises(codec.DecodeError, match="empty file"):
            fn(b"")


@pytest.mark.parametrize("ext", IMAGE_EXTENSIONS)
def test_container_and_size_come_from_the_header(ext):
    img = paint_image(48, 80, seed=2)
    data = image_bytes(img, ext)
    assert formats.image_format(data) == _CONTAINER.get(ext, ext)
    assert formats.header_size(data, formats.image_format(data)) == (48, 80)


def test_a_png_header_claiming_a_huge_size_is_read_without_decoding():
    data = png_claiming(100_000, 200_000)
    assert formats.image_format(data) == "png" and formats.header_size(data, "png") == (100_000, 200_000)
    with pytest.raises(codec.DecodeError, match="IHDR"):
        formats.header_size(data[:20], "png")


@pytest.mark.parametrize("ext, tol", [("pfm", 0.01), ("avif", 4), ("heic", 4), ("gif", 8)])
def test_formats_dali_cannot_read_are_decoded_here(ext, tol):
    img = paint_image(48, 80, seed=4)
    data = image_bytes(img, ext) if ext != "gif" else _pil_gif(img)
    fmt = formats.image_format(data)
    assert fmt not in formats.STORABLE
    out, decoder = formats.decode_other(data, fmt)
    assert out.shape == img.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - img).mean() <= tol  # the same picture (lossy or palette formats: close)
    assert decoder == ("Pillow" if ext == "heic" else "OpenCV")


def _pil_gif(img):
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "GIF")
    return buf.getvalue()


def test_hdr_pfm_is_unsupported_not_silently_clipped():
    data = cv2.imencode(".pfm", np.full((8, 8, 3), 4.0, np.float32))[1].tobytes()
    with pytest.raises(formats.UnsupportedFormat, match="0..1"):
        formats.decode_other(data, "pfm")


def test_dng_is_developed_with_rawpy_or_names_it(monkeypatch):
    data = dng_bytes(64, 96)
    assert formats.image_format(data) == "dng"
    pytest.importorskip("rawpy")
    img, decoder = formats.decode_other(data, "dng")
    assert decoder == "rawpy" and img.shape == (64, 96, 3) and img.dtype == np.uint8
    monkeypatch.setitem(__import__("sys").modules, "rawpy", None)  # as if not installed
    with pytest.raises(formats.UnsupportedFormat, match="install rawpy"):
        formats.decode_other(data, "dng")


def test_unknown_bytes_are_corrupt_and_truncated_tiffs_raise_decode_error():
    with pytest.raises(codec.DecodeError, match="not an image format"):
        formats.decode_other(b"definitely not an image", "unknown")
    tif = image_bytes(paint_image(16, 16), "tif")
    with pytest.raises(codec.DecodeError, match="TIFF header"):
        formats.header_size(tif[:10], "tiff")


def test_what_opencv_decodes_here(tmp_path):
    """The facts docs/inputs.md states about this OpenCV build (update the page if this fails)."""
    img = paint_image(24, 32, seed=1)
    decodes = {}
    for ext in ("png", "bmp", "tif", "webp", "jp2", "avif", "gif", "pfm", "heic"):
        data = image_bytes(img, ext) if ext != "gif" else _pil_gif(img)
        out = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        decodes[ext] = out is not None
    assert decodes == {"png": True, "bmp": True, "tif": True, "webp": True, "jp2": True, "avif": True,
                       "gif": True, "pfm": True, "heic": False}
    pfm = cv2.imdecode(np.frombuffer(image_bytes(img, "pfm"), np.uint8), cv2.IMREAD_COLOR)
    assert pfm.max() <= 1  # IMREAD_COLOR casts PFM's 0..1 floats to 0/1: why fastfeed reads PFM itself


def test_dng_decodes_in_a_process_forked_after_openmp_ran():
    """LibRaw's OpenMP loops hung forever in a pack worker forked from a process that had used
    OpenMP (as torch does): the regression that hung the whole test suite."""
    import os
    import time

    import torch

    pytest.importorskip("rawpy")
    data = dng_bytes(64, 96)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)   # (kept through the fork: a child whose main thread asks for one thread never hangs)
    try:
        torch.randn(2_000_000).add_(1).sum()   # an OpenMP parallel region in this process
        pid = os.fork()
        if pid == 0:  # the child: what a pack worker does with a DNG
            try:
                img, _ = formats.decode_other(data, "dng")
                os._exit(0 if img.shape == (64, 96, 3) else 1)
            finally:
                os._exit(2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                return
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("decoding a DNG in a forked child hung")
    finally:
        torch.set_num_threads(threads)
