"""Checkpoints: written atomically, loadable with `torch.load(weights_only=True)` (no pickle of code): a checkpoint
holds only tensors, dicts, lists, numbers, strings and None (a run's, key by key: `resume.checkpoint_state`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from ..procs import alive

FORMAT = "fastfeed-yolo-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """The file is not a fastfeed checkpoint, or does not fit the model asked for."""


class CheckpointNoSpace(CheckpointError):
    """A checkpoint could not be written for lack of space; the previous one is intact (writes are atomic)."""


_TMP = ".{name}.tmp{pid}"   # a checkpoint being written, beside it


def save_checkpoint(path: Path, state: dict) -> None:
    """A fastfeed checkpoint of `state`, written atomically (`write_atomically`)."""
    write_atomically(path, lambda f: torch.save({"format": FORMAT, "version": VERSION, **state}, f),
                     size=_tensor_bytes(state))


def _tensor_bytes(x) -> int:
    """About what torch.save writes for `x`: its tensors' bytes."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (dict, list, tuple)):
        return sum(_tensor_bytes(v) for v in (x.values() if isinstance(x, dict) else x))
    return 0


def _no_space(e: BaseException, folder: Path, size: int | None) -> bool:
    """Whether a failed write was for lack of space: ENOSPC/EDQUOT, or torch's writer failing (it reports a short
    write as `RuntimeError: [enforce fail at inline_container.cc] ... unexpected pos`) with less free than needed."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(e, RuntimeError) and "inline_container" in str(e):
        return size is None or _free(folder) < size
    return False


def _free(folder: Path) -> int:
    with contextlib.suppress(OSError):
        return shutil.disk_usage(folder).free
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def write_atomically(path: Path, write: Callable[[BinaryIO], object], size: int | None = None) -> None:
    """`write(file)` into a temporary file beside `path`, fsync, rename over it, and fsync the folder: a crash,
    a kill -9 or a second Ctrl-C mid-write leaves the previous file intact, and a rename that returned
    survives the node losing power. (`remove_stale_temporaries` cleans up after a writer that was killed.)
    A write that fails for lack of space (`size`: the bytes it needs, when known) is CheckpointNoSpace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(_TMP.format(name=path.name, pid=os.getpid()))
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        if not _no_space(e, path.parent, size):
            raise
        need = f"needs about {_mib(size)}, " if size else ""
        kept = f"the previous {path.name} is intact" if path.is_file() else f"no {path.name} was there before"
        raise CheckpointNoSpace(f"no space left in {path.parent} to write {path.name} ({need}{_mib(_free(path.parent))} "
                                f"free; {kept}: checkpoints are written atomically): free space there or give "
                                "another --out, then continue with --resume") from None
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):   # some filesystems cannot sync a directory; the rename is done either way
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the half-written checkpoints a killed writer left in `folder` (their writer's pid is gone);
    returns what was removed."""
    removed = []
    for tmp in Path(folder).glob(_TMP.format(name="*.pt", pid="*")):
        pid = tmp.name.rpartition(".tmp")[2]
        if pid.isdigit() and not alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def check_intact(path) -> None:
    """CheckpointError when a record of the zip torch.save wrote at `path` does not match its CRC-32: torch.load
    checks none, so a flipped byte in a tensor would load as a silently different weight (a read of the file; a few
    tenths of a second for a large model). Not a zip: zipfile.BadZipFile."""
    with zipfile.ZipFile(path) as z:
        if (bad := z.testzip()) is not None:
            raise CheckpointError(f"{path} is damaged: {bad}'s bytes do not match their CRC-32 (a disk or copy "
                                  "error): use an intact copy of it")


def load_checkpoint(path, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        check_intact(path)
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:   # not a zip/pickle, or holds objects weights_only refuses
        raise CheckpointError(f"{path} is not a loadable fastfeed checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a fastfeed checkpoint (no '{FORMAT}' marker)")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"{path} is checkpoint version {ckpt.get('version')}; this fastfeed reads version "
                              f"{VERSION}")
    return ckpt

