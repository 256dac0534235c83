"""Checkpoints: written atomically, loadable with `torch.load(weights_only=True)` (no pickle of code).

A checkpoint holds only tensors, dicts, lists, numbers, strings and None: the model and EMA state
dicts, the optimizer's and the GradScaler's state, the counters that place the LR schedule
(epoch, optimizer step, batches done in the epoch), the torch RNG states, and the run's
configuration and class names.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT = "fastfeed-yolo-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """The file is not a fastfeed checkpoint, or does not fit the model asked for."""


def save_checkpoint(path: Path, state: dict) -> None:
    """Write to a temporary file beside `path`, fsync, and rename over it: a crash (or a NaN stop)
    mid-write leaves the previous checkpoint intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, "version": VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:   # not a zip/pickle, or holds objects weights_only refuses
        raise CheckpointError(f"{path} is not a loadable fastfeed checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a fastfeed checkpoint (no '{FORMAT}' marker)")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"{path} is checkpoint version {ckpt.get('version')}; this fastfeed reads version "
                              f"{VERSION}")
    return ckpt

