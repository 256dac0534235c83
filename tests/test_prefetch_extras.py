"""The DevicePrefetcher moves a batch's task geometry (masks, keypoints, rboxes) with its images, and the Batch
contract around it."""

from __future__ import annotations

import pytest
import torch
from prefetch_helpers import FakeDeviceModule, RecordingOps, both_drivers

from fastfeed.batch import Batch
from fastfeed.device_augment import DeviceAugment
from fastfeed.prefetch import DevicePrefetcher


class ExtrasLoader:
    """Batch k: images all k, one box, masks all k, keypoints all k / 10, rboxes all k / 100, every tensor
    overwritten in place when the next batch is asked for (the pool loaders' contract at its harshest)."""

    def __init__(self, n=4):
        self.n = n
        self.images = torch.empty((2, 3, 8, 8), dtype=torch.uint8)
        self.targets = torch.zeros((1, 6))
        self.masks = torch.empty((2, 2, 2), dtype=torch.int16)
        self.keypoints = torch.empty((1, 3, 3))
        self.rboxes = torch.empty((1, 5))

    def __len__(self):
        return self.n

    def __iter__(self):
        for k in range(self.n):
            self.images.fill_(k)
            self.masks.fill_(k)
            self.keypoints.fill_(k / 10)
            self.rboxes.fill_(k / 100)
            yield Batch(self.images, self.targets, torch.tensor([k, k]), masks=self.masks, keypoints=self.keypoints,
                        rboxes=self.rboxes)


def expect_extras(b: Batch, k: int):
    assert set(b.extras()) == {"masks", "keypoints", "rboxes"}
    assert b.masks.dtype == torch.int16 and torch.equal(b.masks, torch.full((2, 2, 2), k, dtype=torch.int16))
    assert torch.allclose(b.keypoints, torch.full((1, 3, 3), k / 10))
    assert torch.allclose(b.rboxes, torch.full((1, 5), k / 100))
    assert b.indices.tolist() == [k, k]


@both_drivers
def test_the_host_path_copies_the_extras_out_of_the_loaders_buffers(thread):
    got = list(DevicePrefetcher(ExtrasLoader(), "cpu", thread=thread))   # all held: the loader overwrote its own
    for k, b in enumerate(got):
        expect_extras(b, k)
        assert torch.equal(b.images, torch.full_like(b.images, k / 255))


@both_drivers
def test_the_extras_travel_on_the_side_stream_and_the_consumer_records_them(thread):
    log = []
    mod = FakeDeviceModule(log)
    pf = DevicePrefetcher(ExtrasLoader(), "cuda", depth=2, thread=thread, ops=RecordingOps(mod, torch.device("cuda")))
    got = []
    for b in pf:
        got.append((b, len(log)))
        log.append(("use", len(got) - 1))
    copies = [e for e in log if e[0] == "copy"]
    assert len(copies) == 5 * 4 and {e[1] for e in copies} == {"side0"}   # images, targets and 3 extras
    for k, (b, used_at) in enumerate(got):
        expect_extras(b, k)
        for t in b.extras().values():
            assert ("record_stream", id(t), "consumer") in log[:used_at]
        assert any(e[0] == "wait" and e[1] == "consumer" for e in log[:used_at])
    # the extras were copied before the event that frees the loader's buffers
    first_copied = next(i for i, e in enumerate(log) if e[0] == "event")
    assert sum(1 for e in log[:first_copied] if e[0] == "copy") == 5


def test_device_augmentation_refuses_a_batch_with_geometry_by_name():
    pf = DevicePrefetcher(ExtrasLoader(), "cpu", device_augment=DeviceAugment(seed=0))
    with pytest.raises(ValueError, match="the device augmentation \\(HSV, flip\\) cannot move a batch's masks, "
                                         "keypoints, rboxes: use LoaderConfig\\(device_augment=False\\)"):
        next(iter(pf))


def test_batch_extras_unpacking_and_repr():
    imgs, t = torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(3, 6)
    plain = Batch(imgs, t, [0, 1])
    assert plain.extras() == {} and plain.masks is None
    assert repr(plain) == "Batch(images=(2, 3, 4, 4), targets=(3, 6), indices=[2])"
    b = Batch(imgs, t, [0, 1], keypoints=torch.zeros(3, 17, 3))
    images, targets = b                       # still the pair it always was
    assert images is imgs and targets is t and len(b) == 2 and b[1] is t
    assert list(b.extras()) == ["keypoints"]
    assert repr(b).endswith("indices=[2], keypoints=(3, 17, 3))")
