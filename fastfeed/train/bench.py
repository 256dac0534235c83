"""`bench_step`: one real training step of the bundled model, for `fastfeed bench --model`."""

from __future__ import annotations

import torch

from ..devices import synchronize, to_channels_last
from .device import forward_loss, grad_scaler
from .loss import YoloLoss
from .model import build_model
from .optim import build_optimizer


def bench_step(model: str, device: torch.device, imgsz: int, batch_size: int, *, nc: int = 80,
               amp: str | None = None, grad_ckpt: bool = False, channels_last: bool = False):
    """A callable(images, targets) running forward, loss, backward and an SGD step of `model`
    ('yolov3' | 'yolov3-tiny'), then waiting for the device, so a timer around it measures the step.

    images: uint8 [B,3,S,S] (as loaders yield them) or float in [0,1], on any device; targets [M,6].
    Targets with classes >= nc are dropped (the bench's store may have more classes than `nc`).
    `amp` ('bf16' | 'fp16'), `grad_ckpt` and `channels_last` as in `fastfeed train`. Only torch is imported here.
    """
    device = torch.device(device)
    net = build_model(model, nc).to(device).train()
    net.grad_ckpt = grad_ckpt
    if channels_last:
        net = to_channels_last(net, device)
    loss_fn = YoloLoss(net, imgsz)
    opt = build_optimizer(net, "sgd", 0.01, 0.937, 5e-4 * batch_size / 64)
    scaler = grad_scaler(device, amp)

    def step(images: torch.Tensor, targets: torch.Tensor) -> None:
        images = images.to(device, non_blocking=True)
        if not images.is_floating_point():
            images = images.float().div_(255)
        if channels_last:
            images = to_channels_last(images, device)
        targets = targets.to(device, non_blocking=True)
        targets = targets[targets[:, 1] < nc]
        loss, _ = forward_loss(net, loss_fn, images, targets, device=device, amp=amp)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        synchronize(device)

    step.model = net
    return step
