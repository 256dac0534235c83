"""Decoding: the cheap pack-time check fails on exactly what a full decode fails on."""

from __future__ import annotations

import numpy as np
import pytest

from fastfeed import codec


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
