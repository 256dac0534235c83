"""The pixels of a batch, on the device: mosaic, affine (perspective included), flip and letterbox as one sampling
map per output pixel, then HSV and the channel order (`bgr`), batched over samples with per-sample parameters
(torch only).

What `augment/paste.py` does on the CPU tile by tile, here for every output pixel at once. For the
pixel centre (x+0.5, y+0.5) of sample b:

    p = Minv_b (x+0.5, y+0.5)                    back into the mid frame (the mosaic canvas, or the
                                                 image itself): Minv undoes the affine, flips included
                                                 (with perspective, a 3x3: divided by its last row)
    t = [p.x >= xc] + 2 [p.y >= yc]              the tile: mosaic_layout's quadrants around the centre
                                                 (one-tile samples: centre at infinity, so t = 0)
    inside = region_t contains p                 else the fill (114)
    u = (p - o_t) / r_t                          tile pixels (the frame Record.tile_size gives)
    value = bilinear(tile_t, u)                  4 gathers from a flat [P,3] uint8 pixel buffer,
                                                 edge pixels replicated

The tiles' pixels live in one flat buffer: the batch's decoded images concatenated, or the VRAM cache's
whole dataset, so the same code serves both (`base` is where each tile's pixels start). Chunks of
samples bound the transient memory (a dozen [chunk,S,S] tensors). No host sync anywhere: everything
queues on the loader's side stream. Output: float32 [B,3,S,S] in [0,1], HSV as device_augment does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...device_augment import hsv_jitter

CHUNK_PIXELS = 1 << 25   # output pixels per chunk on an accelerator (32 Mi: a batch of 64 at 640 in one): few launches
CPU_CHUNK_PIXELS = 1 << 20   # on the CPU: tensors that stay in cache run 2.5x faster (46 against 116 ms a sample)


def chunk_pixels(device: torch.device) -> int:
    """Output pixels rendered at once on `device` (what bounds the render's transient memory)."""
    return CPU_CHUNK_PIXELS if device.type == "cpu" else CHUNK_PIXELS


@dataclass
class Params:
    """One batch's sampling parameters on the device (plan.Plan's arrays, float32 / int64)."""

    minv: torch.Tensor     # [B,3,3]
    centre: torch.Tensor   # [B,2]
    region: torch.Tensor   # [B,4,4]
    place: torch.Tensor    # [B,4,3]
    hsv: torch.Tensor      # [B,3]
    base: torch.Tensor     # int64 [B,4] first pixel row of each tile in the flat buffer
    shape: torch.Tensor    # int64 [B,4,2] (h, w) of each tile
    bgr: torch.Tensor      # [B] 1: the sample's channels in BGR order

    def __getitem__(self, sl: slice) -> Params:
        return Params(*(getattr(self, f)[sl] for f in self.__dataclass_fields__))


def _chunk(pixels: torch.Tensor, p: Params, size: int, fill: float, projective: bool) -> torch.Tensor:
    b, dev = p.minv.shape[0], pixels.device
    c = torch.arange(size, device=dev, dtype=torch.float32) + 0.5
    cx, cy = c.view(1, 1, size), c.view(1, size, 1)
    m = p.minv.reshape(b, 9, 1, 1)
    px = m[:, 0] * cx + m[:, 1] * cy + m[:, 2]                                     # [b,S,S] mid frame
    py = m[:, 3] * cx + m[:, 4] * cy + m[:, 5]
    if projective:
        w = m[:, 6] * cx + m[:, 7] * cy + m[:, 8]
        px, py = px / w, py / w
    t = (px >= p.centre[:, 0, None, None]).long() + 2 * (py >= p.centre[:, 1, None, None]).long()
    key = t + 4 * torch.arange(b, device=dev).view(b, 1, 1)                        # index into [b*4] tables
    reg = p.region.reshape(-1, 4)[key]
    inside = (px >= reg[..., 0]) & (px < reg[..., 2]) & (py >= reg[..., 1]) & (py < reg[..., 3])
    del reg
    pl = p.place.reshape(-1, 3)[key]
    hw = p.shape.reshape(-1, 2)[key]
    h, w = hw[..., 0], hw[..., 1]
    fx = ((px - pl[..., 1]) / pl[..., 0] - 0.5).clamp_(min=0.0)                    # source pixel-centre index
    fy = ((py - pl[..., 2]) / pl[..., 0] - 0.5).clamp_(min=0.0)
    del px, py, pl, hw
    fx = torch.minimum(fx, (w - 1).to(fx.dtype))
    fy = torch.minimum(fy, (h - 1).to(fy.dtype))
    x0, y0 = fx.floor(), fy.floor()
    wx, wy = (fx - x0).unsqueeze(-1), (fy - y0).unsqueeze(-1)
    x0, y0 = x0.long(), y0.long()
    x1, y1 = torch.minimum(x0 + 1, w - 1), torch.minimum(y0 + 1, h - 1)
    base = p.base.reshape(-1)[key]
    row0, row1 = base + y0 * w, base + y1 * w
    del base, y0, y1, key

    def at(row, col):
        return pixels[row + col].float()

    top = torch.lerp(at(row0, x0), at(row0, x1), wx)
    bottom = torch.lerp(at(row1, x0), at(row1, x1), wx)
    v = torch.lerp(top, bottom, wy)
    v = torch.where(inside.unsqueeze(-1), v, torch.full((), fill, dtype=v.dtype, device=dev))
    return v.permute(0, 3, 1, 2)


def render(pixels: torch.Tensor, p: Params, size: int, fill: int, jitter: tuple[bool, bool],
           dtype: torch.dtype = torch.float32, *, projective: bool = False, bgr: bool = False) -> torch.Tensor:
    """The batch's images, `dtype` [B,3,S,S] in [0,1]. pixels: uint8 [P,3] on the device; jitter: (any HSV
    gain, a hue gain): apply `device_augment.hsv_jitter` with p.hsv (the hue turn only with a hue gain);
    projective: p.minv has a perspective row (else it is taken as affine); bgr: reverse the channels of the samples
    p.bgr marks (known from the hyp on the host: no sync here)."""
    b = p.minv.shape[0]
    out = torch.empty((b, 3, size, size), dtype=torch.float32, device=pixels.device)
    step = max(1, chunk_pixels(pixels.device) // (size * size))
    for s in range(0, b, step):
        out[s:s + step] = _chunk(pixels, p[s:s + step], size, float(fill), projective)
    out.div_(255.0)
    if jitter[0]:
        out = hsv_jitter(out, p.hsv[:, 0] if jitter[1] else None, p.hsv[:, 1], p.hsv[:, 2])
    if bgr:
        out = torch.where(p.bgr.view(b, 1, 1, 1) > 0.5, out.flip(1), out)
    return out if dtype == torch.float32 else out.to(dtype)
