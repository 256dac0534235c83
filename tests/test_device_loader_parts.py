"""The device loader's parts against the definitions they mirror: the torch EXIF orientation against
codec.apply_orientation, the sampling map against plain copies and cv2, the payload slots' overflow path. (Its
boxes are the numpy rules themselves, run in its planning workers: tests/test_device_loader*.py compare its
batches with the cpu loader's.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastfeed import codec, exif
from fastfeed.loaders.device.decode import fit, orient
from fastfeed.loaders.device.render import Params, render


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_equals_codec_apply_orientation(orientation):
    img = np.random.default_rng(orientation).integers(0, 255, (5, 7, 3), dtype=np.uint8)
    want = codec.apply_orientation(img, orientation)
    got = orient(torch.from_numpy(img), orientation).numpy()
    assert got.shape == want.shape == (exif.oriented_size(5, 7, orientation) + (3,))
    np.testing.assert_array_equal(got, want)


def test_orient_refuses_other_values():
    with pytest.raises(ValueError, match="EXIF orientation must be 1..8"):
        orient(torch.zeros(2, 2, 3, dtype=torch.uint8), 9)


def test_fit_resizes_only_what_differs_and_groups_sizes():
    a = torch.full((8, 6, 3), 200, dtype=torch.uint8)
    b = torch.zeros((4, 4, 3), dtype=torch.uint8)
    out = fit([a, b, a.clone()], [(4, 3), (4, 4), (4, 3)])
    assert [tuple(x.shape) for x in out] == [(4, 3, 3), (4, 4, 3), (4, 3, 3)]
    assert (out[0] == 200).all() and out[1] is not None and (out[1] == 0).all()


def _params(minv, tiles, size=None):
    """Params for B one-tile samples: minv [B,2,3] (affine) or [B,3,3]; tiles: [(h, w)] each at base row sum of the previous."""
    b = len(tiles)
    rows = np.cumsum([0] + [h * w for h, w in tiles])[:-1]
    region = torch.zeros(b, 4, 4)
    for j, (h, w) in enumerate(tiles):
        region[j, 0] = torch.tensor([0.0, 0.0, w, h])
    place = torch.tensor([1.0, 0.0, 0.0]).repeat(b, 4, 1)
    shape = torch.ones(b, 4, 2, dtype=torch.int64)
    shape[:, 0] = torch.tensor(tiles)
    base = torch.zeros(b, 4, dtype=torch.int64)
    base[:, 0] = torch.from_numpy(rows)
    minv = np.concatenate([minv, np.tile([[[0.0, 0.0, 1.0]]], (b, 1, 1))], 1) if np.shape(minv)[1] == 2 else minv
    return Params(torch.as_tensor(minv, dtype=torch.float32), torch.full((b, 2), float("inf")), region, place,
                  torch.tensor([[0.0, 1.0, 1.0]] * b), base, shape, torch.zeros(b))


def test_render_copies_at_scale_one_and_fills_outside():
    rng = np.random.default_rng(3)
    img = rng.integers(0, 255, (6, 9, 3), dtype=np.uint8)
    minv = np.array([[[1.0, 0, -2.0], [0, 1.0, -1.0]]])      # the image placed at (2, 1) of a 12x12 output
    out = render(torch.from_numpy(img).reshape(-1, 3), _params(minv, [(6, 9)]), 12, 114, (False, False))
    got = (out[0] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    want = np.full((12, 12, 3), 114, np.uint8)
    want[1:7, 2:11] = img
    np.testing.assert_array_equal(got, want)


def test_render_resizes_as_cv2_inter_linear():
    import cv2

    rng = np.random.default_rng(4)
    img = cv2.resize(rng.integers(0, 255, (8, 10, 3), dtype=np.uint8), (40, 32), interpolation=cv2.INTER_CUBIC)
    want = cv2.resize(img, (30, 24), interpolation=cv2.INTER_LINEAR)          # scale 0.75
    minv = np.array([[[1 / 0.75, 0, 0], [0, 1 / 0.75, 0]]])
    out = render(torch.from_numpy(img).reshape(-1, 3), _params(minv, [(32, 40)]), 30, 114, (False, False))
    got = (out[0] * 255).permute(1, 2, 0)[:24].numpy()
    assert np.abs(got - want).max() <= 1.0     # OpenCV's fixed-point weights against float


def test_render_flips_with_the_matrix_and_stays_in_range_with_hsv():
    img = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
    minv = np.array([[[-1.0, 0, 4.0], [0, 1.0, 0]]])                      # x -> 4 - x: a mirror
    p = _params(minv, [(4, 4)])
    out = render(torch.from_numpy(img).reshape(-1, 3), p, 4, 114, (False, False))
    np.testing.assert_array_equal((out[0] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy(), img[:, ::-1])
    p.hsv = torch.tensor([[0.3, 1.7, 1.4]])
    out = render(torch.from_numpy(img).reshape(-1, 3), p, 4, 114, (True, True), dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and float(out.min()) >= 0 and float(out.max()) <= 1
