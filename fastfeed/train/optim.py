"""Optimizer (three parameter groups), the learning-rate schedule with warmup, and the EMA of weights."""

from __future__ import annotations

import math
from copy import deepcopy

import torch
from torch import nn


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float):
    """SGD (Nesterov) or AdamW over three groups: conv weights (decayed), norm weights and biases
    (not decayed: shrinking a BatchNorm scale or a bias towards 0 only fights the normalisation).

    Group order is fixed (0 weights, 1 norms, 2 biases): the warmup treats biases apart.
    """
    decay, norms, biases = [], [], []
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if pname == "bias":
                biases.append(p)
            elif isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)):
                norms.append(p)
            else:
                decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": norms, "weight_decay": 0.0},
              {"params": biases, "weight_decay": 0.0}]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    raise ValueError(f"unknown optimizer {name!r}; valid optimizers: sgd, adamw")


def lr_factor(step: int, total: int, schedule: str, lrf: float) -> float:
    """Multiplier of the base lr after `step` of `total` optimizer steps: 1 at the start, `lrf` at the end."""
    x = min(step / max(total, 1), 1.0)
    if schedule == "cosine":
        return lrf + (1 - lrf) * (1 + math.cos(math.pi * x)) / 2
    return 1 - (1 - lrf) * x


def set_lr(optimizer, step: int, total: int, warmup: int, base_lr: float, cfg) -> float:
    """Set every group's lr (and SGD momentum) for this optimizer step; returns the weights' lr.

    During the `warmup` steps the weights' lr ramps up from 0 while the biases' ramps *down* from
    `warmup_bias_lr` (0.1): the detection biases (objectness priors) move fast at first, when the
    rest of the net is still random, and a large lr on the weights then would blow them up.
    SGD momentum ramps from `warmup_momentum` (0.8) to `momentum` over the same steps.
    """
    target = base_lr * lr_factor(step, total, cfg.schedule, cfg.lrf)
    if step < warmup:
        x = step / warmup
        for k, g in enumerate(optimizer.param_groups):
            start = cfg.warmup_bias_lr if k == 2 else 0.0
            g["lr"] = start + (target - start) * x
            if "momentum" in g:
                g["momentum"] = cfg.warmup_momentum + (cfg.momentum - cfg.warmup_momentum) * x
    else:
        for g in optimizer.param_groups:
            g["lr"] = target
            if "momentum" in g:
                g["momentum"] = cfg.momentum
    return optimizer.param_groups[0]["lr"]


class ModelEMA:
    """Exponential moving average of the weights (and BatchNorm buffers), what is evaluated and saved.

    decay = 0.9999 x (1 - exp(-updates / 2000)): the average follows the model closely at the
    start, when the weights are still far from anything worth averaging, and averages over ~10k
    steps late in training.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.ema = deepcopy(model).eval()
        self.ema.grad_ckpt = False
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.current_decay()
        msd = model.state_dict()
        floats, src = [], []
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                floats.append(v)
                src.append(msd[k])
            else:
                v.copy_(msd[k])   # counters (num_batches_tracked)
        torch._foreach_lerp_(floats, src, 1 - d)   # one fused kernel per dtype, not ~700 small ones
