"""HSV jitter and the horizontal flip on a whole batch of tensors, on the device (torch only).

With `LoaderConfig(device_augment=True)` the workers skip these two steps and the `DevicePrefetcher` applies them
here, after uint8->float, on its own stream. The formulas (docs/design.md, 'HSV jitter in RGB') on floats in [0, 1],
clipped, not rounded to 8-bit levels (up to ~1 level from the workers'), with dh = U(-1,1)*hsv_h, fs = 1 +
U(-1,1)*hsv_s, fv = 1 + U(-1,1)*hsv_v per image, and a left-right flip with probability fliplr (boxes: cx -> 1 - cx).
Draws come from a seeded `torch.Generator` on the batch's device (same seed, same batches; statistically, not pixel
for pixel, the workers'). Outside `fastfeed/augment/` (numpy/OpenCV by design): it imports on a bare GPU machine.
"""

from __future__ import annotations

import hashlib
import math

import torch

from .augment.hyp import check_field

_AXIS = torch.tensor([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]], dtype=torch.float64) / math.sqrt(3.0)


def hue_rotations(turns: torch.Tensor) -> torch.Tensor:
    """[B] turns of the colour circle -> [B,3,3] RGB rotation matrices (augment.hsv.hue_rotation, batched)."""
    a = 2.0 * math.pi * turns.double()
    cos, sin = torch.cos(a)[:, None, None], torch.sin(a)[:, None, None]
    eye = torch.eye(3, dtype=torch.float64, device=turns.device)
    return cos * eye + (1.0 - cos) / 3.0 + sin * _AXIS.to(turns.device)


def hsv_jitter(images: torch.Tensor, dh: torch.Tensor | None, fs: torch.Tensor, fv: torch.Tensor) -> torch.Tensor:
    """Jittered copy of float `images` [B,3,H,W] in [0,1]: hue turn dh (None: no turn), saturation x fs,
    value x fv ([B] each). Only batched kernels, no host sync: it queues on a device stream as is."""
    b = images.shape[0]
    x = images
    if dh is not None:
        rot = hue_rotations(dh).to(images.dtype)
        x = torch.bmm(rot, images.reshape(b, 3, -1)).reshape(images.shape).clamp_(0.0, 1.0)
    peak = x.amax(dim=1, keepdim=True)
    a = (fv * fs).to(images.dtype).view(b, 1, 1, 1)
    c = (fv * (1.0 - fs)).to(images.dtype).view(b, 1, 1, 1)
    return torch.addcmul(x * a, peak, c).clamp_(0.0, 1.0)   # a*x + c*max, one pass each


def hflip(images: torch.Tensor, targets: torch.Tensor, flip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip left-right the images where bool `flip` [B] is set, and their boxes (targets [M,6]: cx -> 1 - cx).

    Both are new tensors; no host sync (no boolean indexing), so it queues on a device stream as is.
    """
    x = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    t = targets.clone()
    if t.shape[0]:
        f = flip[t[:, 0].long()]
        t[:, 2] = torch.where(f, 1.0 - t[:, 2], t[:, 2])
    return x, t


def _mix(*keys: int) -> int:
    """A 63-bit seed from integers (stable across runs and platforms, unlike hash() of other types)."""
    return int.from_bytes(hashlib.blake2b(repr(tuple(int(k) for k in keys)).encode(), digest_size=8).digest(),
                          "little") >> 1


class DeviceAugment:
    """Seeded batched HSV jitter + horizontal flip: `images, targets = aug(images, targets)`.

    images: float [B,3,H,W] in [0,1] on any device; targets: float [M,6] img_idx, cls, cx, cy, w, h
    on the same device. Returns new tensors (inputs untouched). Draws come from a generator on the
    images' device, seeded from (seed, *keys) by `reseed` (the prefetcher calls it per epoch and rank).
    """

    def __init__(self, hsv_h: float = 0.015, hsv_s: float = 0.7, hsv_v: float = 0.4, fliplr: float = 0.5,
                 seed: int = 0):
        for name, value in (("hsv_h", hsv_h), ("hsv_s", hsv_s), ("hsv_v", hsv_v), ("fliplr", fliplr)):
            check_field(name, value, owner="DeviceAugment")   # AugmentHyp's ranges
        self.hsv_h, self.hsv_s, self.hsv_v, self.fliplr = float(hsv_h), float(hsv_s), float(hsv_v), float(fliplr)
        self.seed = int(seed)
        self._keys: tuple[int, ...] = ()
        self._gen: torch.Generator | None = None

    @classmethod
    def from_hyp(cls, hyp, seed: int = 0) -> DeviceAugment:
        """From anything with hsv_h, hsv_s, hsv_v and fliplr attributes (e.g. an `AugmentHyp`)."""
        return cls(hyp.hsv_h, hyp.hsv_s, hyp.hsv_v, hyp.fliplr, seed=seed)

    @property
    def active(self) -> bool:
        return any((self.hsv_h, self.hsv_s, self.hsv_v, self.fliplr))

    def reseed(self, *keys: int) -> None:
        """Restart the draws from (seed, *keys): e.g. reseed(epoch, rank) makes each epoch reproducible."""
        self._keys = tuple(int(k) for k in keys)
        if self._gen is not None:
            self._gen.manual_seed(_mix(self.seed, *self._keys))

    def _generator(self, device: torch.device) -> torch.Generator:
        if self._gen is None or self._gen.device != device:
            self._gen = torch.Generator(device=device)
            self._gen.manual_seed(_mix(self.seed, *self._keys))
        return self._gen

    def draw(self, batch: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(dh, fs, fv, flip) for `batch` images: four uniforms per image, always drawn in this order."""
        u = torch.rand(batch, 4, generator=self._generator(device), device=device, dtype=torch.float32)
        sym = u[:, :3] * 2.0 - 1.0
        return sym[:, 0] * self.hsv_h, 1.0 + sym[:, 1] * self.hsv_s, 1.0 + sym[:, 2] * self.hsv_v, u[:, 3] < self.fliplr

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not images.is_floating_point() or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be float [B,3,H,W] in [0,1], got {images.dtype} {tuple(images.shape)}")
        dh, fs, fv, flip = self.draw(images.shape[0], images.device)
        if self.hsv_h or self.hsv_s or self.hsv_v:
            images = hsv_jitter(images, dh if self.hsv_h else None, fs, fv)
        return hflip(images, targets, flip) if self.fliplr else (images, targets.clone())

    def __repr__(self) -> str:
        return (f"DeviceAugment(hsv_h={self.hsv_h}, hsv_s={self.hsv_s}, hsv_v={self.hsv_v}, fliplr={self.fliplr}, "
                f"seed={self.seed})")
