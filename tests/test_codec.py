"""Decoding: the cheap pack-time check fails on exactly what a full decode fails on."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import jpeg_bytes, paint_image

from fastfeed import codec, exif


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
        want = codec.cover_size(*size, 200)
        got = codec.decode_payload("jpeg", big, size, want, orientation=o)
        assert got.shape[:2] == codec.decoded_size("jpeg", size, want, o)
        assert got.shape[0] >= want[0] and got.shape[1] >= want[1] and max(got.shape[:2]) < 320
