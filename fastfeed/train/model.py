"""YOLOv3 and YOLOv3-tiny, written out layer by layer (no cfg parser), after Darknet's yolov3.cfg and yolov3-tiny.cfg;
their conventions (the layer, BatchNorm's values, the decoding the loss's assignment needs): docs/training.md, "The
model". `model.grad_ckpt = True` recomputes the backbone stages in backward instead of keeping their activations
(torch.utils.checkpoint, use_reentrant=False). `prepare_model`: --sync-bn, --freeze-bn, --channels-last, before DDP.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..devices import to_channels_last
from .config import MODELS
from .device import TrainError

log = logging.getLogger(__name__)

# Anchors in pixels (w, h), three per scale, from Darknet's cfgs (k-means on COCO).
ANCHORS = {
    "yolov3": {8: ((10, 13), (16, 30), (33, 23)),
               16: ((30, 61), (62, 45), (59, 119)),
               32: ((116, 90), (156, 198), (373, 326))},
    "yolov3-tiny": {16: ((10, 14), (23, 27), (37, 58)),
                    32: ((81, 82), (135, 169), (344, 319))},
}


class Conv(nn.Sequential):
    """Conv2d(bias=False) + BatchNorm + LeakyReLU(0.1): Darknet's 'convolutional' layer."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1):
        super().__init__(nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False),
                         nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03),
                         nn.LeakyReLU(0.1, inplace=True))


class Residual(nn.Module):
    """Darknet-53's residual unit: 1x1 halves the channels, 3x3 restores them, plus the input."""

    def __init__(self, c: int):
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c // 2, 1), Conv(c // 2, c, 3)

    def forward(self, x):
        return x + self.cv2(self.cv1(x))


def _stage(c_in: int, c_out: int, n: int) -> nn.Sequential:
    """A stride-2 3x3 conv, then n residual units: one Darknet-53 stage."""
    return nn.Sequential(Conv(c_in, c_out, 3, 2), *(Residual(c_out) for _ in range(n)))


def _neck(c_in: int, c: int) -> nn.Sequential:
    """Five alternating 1x1 / 3x3 convs ending at c channels (the 'branch point' of a YOLOv3 scale)."""
    return nn.Sequential(Conv(c_in, c, 1), Conv(c, 2 * c, 3), Conv(2 * c, c, 1), Conv(c, 2 * c, 3), Conv(2 * c, c, 1))


class Detect(nn.Module):
    """The per-scale output convs (with bias) and the decoding of their raw maps into boxes."""

    def __init__(self, nc: int, channels: tuple[int, ...], strides: tuple[int, ...], anchors: dict):
        super().__init__()
        self.nc, self.no, self.na, self.nl = nc, nc + 5, 3, len(strides)
        self.strides = strides
        self.m = nn.ModuleList(nn.Conv2d(c, self.na * self.no, 1) for c in channels)
        # Anchors in pixels [nl, na, 2]; a buffer so they move with the model and live in checkpoints.
        self.register_buffer("anchors", torch.tensor([anchors[s] for s in strides], dtype=torch.float32))
        # Start objectness near the prior of ~8 objects per 640² image and classes near uniform, so the
        # first steps are not spent pushing every cell's sigmoid down from 0.5 (from YOLOv5).
        for conv, s in zip(self.m, self.strides):
            b = conv.bias.view(self.na, self.no)
            with torch.no_grad():
                b[:, 4] += math.log(8 / (640 / s) ** 2)
                b[:, 5:] += math.log(0.6 / (self.nc - 0.99)) if self.nc > 1 else 0.0

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [conv(x).view(x.shape[0], self.na, self.no, *x.shape[2:]).permute(0, 1, 3, 4, 2).contiguous()
                for conv, x in zip(self.m, feats)]   # [B, na, h, w, no] per scale

    def decode(self, raw: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps -> [B, N, 5 + nc]: cx, cy, w, h in input pixels, objectness, class probabilities."""
        z = []
        for i, p in enumerate(raw):
            b, na, h, w, no = p.shape
            p = p.float().sigmoid()
            gy, gx = torch.meshgrid(torch.arange(h, device=p.device), torch.arange(w, device=p.device), indexing="ij")
            grid = torch.stack((gx, gy), -1).view(1, 1, h, w, 2).float()
            xy = (p[..., :2] * 2 - 0.5 + grid) * self.strides[i]
            wh = (p[..., 2:4] * 2) ** 2 * self.anchors[i].view(1, na, 1, 1, 2)
            z.append(torch.cat((xy, wh, p[..., 4:]), -1).view(b, -1, no))
        return torch.cat(z, 1)


@contextmanager
def _bn_stats_frozen(module: nn.Module):
    """BatchNorm normalises with batch statistics but leaves its running statistics alone: checkpointed stages run
    forward twice (once more in backward), which would update them twice per step and drift from a plain run."""
    # momentum 0 makes the update running = 1 x running + 0 x batch: unchanged. (Switching running stats
    # off instead would change which tensors BatchNorm saves, and checkpoint insists they match.)
    bns = [(m, m.momentum, m.num_batches_tracked.clone()) for m in module.modules()
           if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    for m, _, _ in bns:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, tracked in bns:
            m.momentum = momentum
            m.num_batches_tracked.copy_(tracked)


class YOLO(nn.Module):
    """Backbone stages (`self.stages`, checkpointable) + a head that returns per-scale feature maps."""

    name: str

    def __init__(self, nc: int):
        super().__init__()
        if not isinstance(nc, int) or nc < 1:
            raise ValueError(f"nc (number of classes) must be an integer >= 1, got {nc!r}")
        self.nc = nc
        self.grad_ckpt = False

    def backbone(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The stem, then every stage in turn (checkpointed with --grad-ckpt); each stage's output."""
        x = self.stem(x)
        feats = []
        for stage in self.stages:
            x = self.run_stage(stage, x)
            feats.append(x)
        return feats

    def run_stage(self, stage: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not (self.grad_ckpt and self.training and torch.is_grad_enabled()):
            return stage(x)
        calls = 0

        def fn(t):
            nonlocal calls
            calls += 1
            if calls == 1:
                return stage(t)
            with _bn_stats_frozen(stage):   # the recomputation in backward
                return stage(t)

        return checkpoint(fn, x, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x: float [B,3,S,S] in 0..1, S a multiple of 32 -> raw maps [B,3,S/s,S/s,5+nc] per stride s."""
        return self.detect(self.head(x))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.detect.decode(self.forward(x))


class YOLOv3(YOLO):
    """Darknet-53 (stages of 1, 2, 8, 8, 4 residual units) + the three-scale head at strides 8/16/32."""

    name = "yolov3"

    def __init__(self, nc: int = 80):
        super().__init__(nc)
        self.stem = Conv(3, 32, 3)
        self.stages = nn.ModuleList([_stage(32, 64, 1), _stage(64, 128, 2), _stage(128, 256, 8),
                                     _stage(256, 512, 8), _stage(512, 1024, 4)])
        self.neck5, self.out5 = _neck(1024, 512), Conv(512, 1024, 3)
        self.lat5 = Conv(512, 256, 1)
        self.neck4, self.out4 = _neck(256 + 512, 256), Conv(256, 512, 3)
        self.lat4 = Conv(256, 128, 1)
        self.neck3, self.out3 = _neck(128 + 256, 128), Conv(128, 256, 3)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.detect = Detect(nc, (256, 512, 1024), (8, 16, 32), ANCHORS[self.name])

    def head(self, x):
        p3, p4, p5 = self.backbone(x)[2:]       # strides 8, 16, 32
        x5 = self.neck5(p5)
        x4 = self.neck4(torch.cat((self.up(self.lat5(x5)), p4), 1))
        x3 = self.neck3(torch.cat((self.up(self.lat4(x4)), p3), 1))
        return [self.out3(x3), self.out4(x4), self.out5(x5)]


class YOLOv3Tiny(YOLO):
    """Seven 3x3 convs with max-pooling, then two scales at strides 16 and 32 (as Darknet's
    yolov3-tiny.cfg: the tiny model has no stride-8 output)."""

    name = "yolov3-tiny"

    def __init__(self, nc: int = 80):
        super().__init__(nc)

        def down(c_in, c_out):
            return nn.Sequential(nn.MaxPool2d(2, 2), Conv(c_in, c_out, 3))

        self.stem = Conv(3, 16, 3)
        self.stages = nn.ModuleList([
            nn.Sequential(down(16, 32), down(32, 64)),                     # stride 4
            nn.Sequential(down(64, 128), down(128, 256)),                  # stride 16 (p4)
            nn.Sequential(down(256, 512), nn.ZeroPad2d((0, 1, 0, 1)), nn.MaxPool2d(2, 1),
                          Conv(512, 1024, 3)),                             # stride 32 (p5)
        ])
        self.neck5, self.out5 = Conv(1024, 256, 1), Conv(256, 512, 3)
        self.lat5 = Conv(256, 128, 1)
        self.out4 = Conv(128 + 256, 256, 3)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.detect = Detect(nc, (256, 512), (16, 32), ANCHORS[self.name])

    def head(self, x):
        p4, p5 = self.backbone(x)[1:]
        x5 = self.neck5(p5)
        return [self.out4(torch.cat((self.up(self.lat5(x5)), p4), 1)), self.out5(x5)]


def build_model(name: str, nc: int) -> YOLO:
    """`name`: 'yolov3' or 'yolov3-tiny'; `nc`: number of classes (the store's)."""
    for cls in (YOLOv3, YOLOv3Tiny):
        if cls.name == name:
            return cls(nc)
    raise ValueError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(name: str, nc: int, imgsz: int) -> float:
    """Forward GFLOPs for one image at imgsz², 2 x the multiply-accumulates of every Conv2d (forward hooks on the
    meta device: shapes only; BatchNorm, activations, bias adds and upsampling, < 1 %, are not counted)."""
    with torch.device("meta"):
        model = build_model(name, nc).eval()
    macs = 0

    def hook(m: nn.Conv2d, inputs, out):
        nonlocal macs
        kh, kw = m.kernel_size
        macs += out.numel() // out.shape[0] * (m.in_channels // m.groups) * kh * kw

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(torch.zeros(1, 3, imgsz, imgsz, device="meta"))
    for h in handles:
        h.remove()
    return 2 * macs / 1e9


def _stay_in_eval(module: nn.Module, args) -> None:
    module.training = False   # model.train() sets it back; the forward pass must not see it


def prepare_model(model: nn.Module, cfg, device: torch.device, world_size: int, backend: str) -> nn.Module:
    """The model as --freeze-bn, --sync-bn and --channels-last ask (in that order; the first two exclude
    each other, TrainConfig checks)."""
    if cfg.freeze_bn:   # docs/training.md: eval mode in every forward, whatever model.train() said; no gradient
        bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        for m in bns:
            m.eval()
            m.register_forward_pre_hook(_stay_in_eval)
            for p in m.parameters(recurse=False):
                p.requires_grad_(False)
        log.info("--freeze-bn: %d BatchNorm layers keep their statistics and weights", len(bns))
        if cfg.weights is None and not cfg.resume:
            log.warning("--freeze-bn without --weights freezes freshly initialised BatchNorm layers "
                        "(mean 0, variance 1): meant for fine-tuning")
    if cfg.sync_bn:   # BatchNorm -> SyncBatchNorm (docs/training.md, --sync-bn): only nccl and hccl can run it
        if backend == "gloo" or device.type == "cpu":
            raise TrainError(f"--sync-bn: SyncBatchNorm synchronises BatchNorm statistics between processes with nccl "
                             f"(CUDA) or hccl (Ascend NPU); this run's processes use {backend} on the {device.type}, "
                             "which it does not support. Drop --sync-bn, or train on --device cuda or npu")
        if world_size == 1:
            log.warning("--sync-bn with one process: there is nothing to synchronise, BatchNorm stays as it is")
        else:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.channels_last:
        model = to_channels_last(model, device)
    return model
