"""Getting records' pixels onto the device: nvJPEG through torchvision or nvImageCodec, or the host.

    decoder = make_decoder("auto", torch.device("cuda", 0))
    images = decoder.decode([(payload_tensor, orientation), ...], stream)   # [H,W,3] uint8, upright

"auto" picks torchvision.io.decode_jpeg (batched nvJPEG) on a CUDA device when torchvision imports, else
nvImageCodec (`nvidia-nvimgcodec-cu12`) when it imports, else the host: the planning workers decode with
`Record.decode` and ship pixels, copied up as uint8 (the only path off CUDA: the CPU, Ascend NPUs). A decoder that
cannot run is an error, never a silent fall-back. Only JPEG records are decoded on the device; other codecs take the
host path, raw stores need no decode. Device-decoded pixels are in the stored frame: `orient` turns them as
`codec.apply_orientation` does (tested for all 8 EXIF values), `fit` resizes them (antialiased) to the tile.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.nn.functional as F

from ...exif import orientation_steps

log = logging.getLogger(__name__)

DECODERS = ("auto", "torchvision", "nvimgcodec", "host")


def orient(img: torch.Tensor, orientation: int) -> torch.Tensor:
    """The upright [H,W,C] image for an EXIF orientation 1..8: `exif.orientation_steps` in torch (mirror
    left-right, then turn anticlockwise), as `exif.apply_orientation` does with OpenCV."""
    mirror, degrees = orientation_steps(orientation)
    if mirror:
        img = img.flip(1)
    return torch.rot90(img, degrees // 90, dims=(0, 1)) if degrees else img


def fit(images: list[torch.Tensor], shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Each [H,W,3] uint8 image resized to its (h, w) in `shapes` (bilinear, antialiased when shrinking),
    contiguous; images of the same size and target go through one interpolate call."""
    out: list = [None] * len(images)
    groups = defaultdict(list)
    for k, (img, shape) in enumerate(zip(images, shapes)):
        if tuple(img.shape[:2]) == tuple(shape):
            out[k] = img.contiguous()
        else:
            groups[(tuple(img.shape[:2]), tuple(shape))].append(k)
    for (_, shape), ks in groups.items():
        x = torch.stack([images[k] for k in ks]).permute(0, 3, 1, 2).float()
        y = F.interpolate(x, size=shape, mode="bilinear", antialias=True, align_corners=False)
        y = y.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        for k, img in zip(ks, y):
            out[k] = img.contiguous()
    return out


class HostDecoder:
    """No decoding on the device: the workers ship pixels (`plan.SHIP_DECODED`)."""

    name, on_host = "host", True

    def decode(self, jpegs, stream=None):   # pragma: no cover - never handed JPEG bytes
        raise AssertionError("the host decoder's workers ship pixels, not JPEG bytes")


class TorchvisionDecoder:
    """torchvision.io.decode_jpeg on a list (batched nvJPEG), on the current (the loader's side) stream."""

    name, on_host = "torchvision", False

    def __init__(self, device: torch.device):
        import torchvision.io as tio

        self.tio, self.device = tio, device

    def decode(self, jpegs, stream=None) -> list[torch.Tensor]:
        chw = self.tio.decode_jpeg([t for t, _ in jpegs], mode=self.tio.ImageReadMode.RGB, device=self.device)
        return [orient(x.permute(1, 2, 0), o) for x, (_, o) in zip(chw, jpegs)]


class NvImageCodecDecoder:
    """nvImageCodec's batched decoder, its work queued on the loader's side stream."""

    name, on_host = "nvimgcodec", False

    def __init__(self, device: torch.device):
        from nvidia import nvimgcodec

        self.nv, self.device = nvimgcodec, device
        self.decoder = nvimgcodec.Decoder(device_id=device.index or 0)
        self.params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                              sample_format=nvimgcodec.SampleFormat.I_RGB)

    def decode(self, jpegs, stream=None) -> list[torch.Tensor]:
        srcs = [self.nv.CodeStream(t.numpy()) for t, _ in jpegs]
        images = self.decoder.decode(srcs, params=self.params, cuda_stream=getattr(stream, "cuda_stream", 0))
        out = []
        for img, (_, o) in zip(images, jpegs):
            if img is None:
                raise RuntimeError("nvImageCodec could not decode an image of the batch")
            out.append(orient(torch.as_tensor(img, device=self.device).clone(), o))   # own the memory
        return out


def _why_not(name: str) -> str | None:
    """Why decoder `name` does not import here (None: it does)."""
    try:
        if name == "torchvision":
            import torchvision.io as tio
            if not hasattr(tio, "decode_jpeg"):
                return f"torchvision {getattr(tio, '__version__', '')} has no io.decode_jpeg"
        else:
            from nvidia import nvimgcodec  # noqa: F401
    except Exception as e:   # noqa: BLE001 - a torchvision built for another torch raises RuntimeError/OSError too
        return f"{type(e).__name__}: {e}"
    return None


_INSTALL = {"torchvision": "pip install torchvision (the build matching your torch)",
            "nvimgcodec": "pip install nvidia-nvimgcodec-cu12"}


def make_decoder(name: str, device: torch.device):
    """The decoder `name` for `device`; ImportError/ValueError saying what to do when it cannot run there."""
    if name not in DECODERS:
        raise ValueError(f"device option decoder={name!r}; valid: {', '.join(DECODERS)}")
    if name == "host" or (name == "auto" and device.type != "cuda"):
        return HostDecoder()
    if name == "auto":
        for candidate in ("torchvision", "nvimgcodec"):
            why = _why_not(candidate)
            if why is None:
                try:
                    dec = (TorchvisionDecoder if candidate == "torchvision" else NvImageCodecDecoder)(device)
                except Exception as e:   # noqa: BLE001 - e.g. a library that imports but finds no driver
                    why = f"{type(e).__name__}: {e}"
                else:
                    log.info("device loader: decoding JPEGs on %s with %s", device, candidate)
                    return dec
            log.info("device loader: %s cannot decode here (%s)", candidate, why)
        log.warning("device loader: neither torchvision nor nvImageCodec imports, so JPEGs are decoded on the host "
                    "(%s or %s for nvJPEG on the GPU)", _INSTALL["torchvision"], _INSTALL["nvimgcodec"])
        return HostDecoder()
    if device.type != "cuda":
        raise ValueError(f"device option decoder={name!r} decodes on NVIDIA GPUs (nvJPEG) and the loader's device is "
                         f"{device}; use decoder='host' (or 'auto', which picks it there)")
    if (why := _why_not(name)) is not None:
        raise ImportError(f"device option decoder={name!r} needs {name}, which does not import here ({why}): "
                          f"{_INSTALL[name]}, or use decoder='auto'")
    return (TorchvisionDecoder if name == "torchvision" else NvImageCodecDecoder)(device)


def load_items(items, slot: torch.Tensor | None, decoder, upload, stream=None) -> dict[int, torch.Tensor]:
    """{record: upright [h,w,3] uint8 image on the device at item.shape} for `plan.Item`s whose bytes lie in
    `slot` (or in item.data). upload(t): a host tensor onto the device (a copy). A JPEG the device decoder
    rejects raises RuntimeError naming its record."""
    out, jpegs = {}, []
    for it in items:
        data = slot[it.offset:it.offset + it.nbytes] if it.offset >= 0 else torch.frombuffer(bytearray(it.data),
                                                                                           dtype=torch.uint8)
        if it.kind == "pixels":
            out[it.record] = upload(data.view(it.shape[0], it.shape[1], 3))
        else:
            jpegs.append((it, data))
    if jpegs:
        try:
            images = decoder.decode([(data, it.orientation) for it, data in jpegs], stream)
        except Exception as e:   # noqa: BLE001 - find the record: decode one by one
            for it, data in jpegs:
                try:
                    decoder.decode([(data, it.orientation)], stream)
                except Exception as one:   # noqa: BLE001
                    raise RuntimeError(f"{decoder.name} could not decode {it.where}: {one}; run "
                                       "`fastfeed verify --decode`, or use decoder='host'") from one
            raise RuntimeError(f"{decoder.name} failed on a batch of {len(jpegs)} JPEGs ({e}) though each "
                               "decodes alone") from e
        for (it, _), img in zip(jpegs, fit(images, [it.shape for it, _ in jpegs])):
            out[it.record] = img
    return out
