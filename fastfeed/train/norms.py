"""What --sync-bn, --freeze-bn and --channels-last do to the model, before DDP wraps it."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..devices import to_channels_last
from .device import TrainError

log = logging.getLogger(__name__)


def sync_batchnorm(model: nn.Module, device: torch.device, world_size: int, backend: str) -> nn.Module:
    """BatchNorm -> SyncBatchNorm: each layer normalises with statistics over every rank's micro-batch
    (what a small per-device batch needs). Only nccl (CUDA) and hccl (NPU) can run it."""
    if backend == "gloo" or device.type == "cpu":
        raise TrainError(f"--sync-bn: SyncBatchNorm synchronises BatchNorm statistics between processes with nccl "
                         f"(CUDA) or hccl (Ascend NPU); this run's processes use {backend} on the {device.type}, "
                         "which it does not support. Drop --sync-bn, or train on --device cuda or npu")
    if world_size == 1:
        log.warning("--sync-bn with one process: there is nothing to synchronise, BatchNorm stays as it is")
        return model
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _stay_in_eval(module: nn.Module, args) -> None:
    module.training = False   # model.train() sets it back; the forward pass must not see it


def freeze_batchnorm(model: nn.Module) -> int:
    """Every BatchNorm normalises with its running statistics and never updates them (eval mode in
    every forward, whatever model.train() said), and its affine weights take no gradient. For fine-tuning
    from --weights: small batches would otherwise overwrite statistics learnt on far more images.
    Returns the number of layers frozen."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.eval()
        m.register_forward_pre_hook(_stay_in_eval)
        for p in m.parameters(recurse=False):
            p.requires_grad_(False)
    return len(bns)


def prepare_model(model: nn.Module, cfg, device: torch.device, world_size: int, backend: str) -> nn.Module:
    """The model as --freeze-bn, --sync-bn and --channels-last ask (in that order; the first two exclude
    each other, TrainConfig checks)."""
    if cfg.freeze_bn:
        n = freeze_batchnorm(model)
        log.info("--freeze-bn: %d BatchNorm layers keep their statistics and weights", n)
        if cfg.weights is None and not cfg.resume:
            log.warning("--freeze-bn without --weights freezes freshly initialised BatchNorm layers "
                        "(mean 0, variance 1): meant for fine-tuning")
    if cfg.sync_bn:
        model = sync_batchnorm(model, device, world_size, backend)
    if cfg.channels_last:
        model = to_channels_last(model, device)
    return model
