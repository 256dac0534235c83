"""Ultralytics' training arguments -> fastfeed's: which loader, which augmentation, and a warning for
every argument fastfeed cannot honour (never a silently different run)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from dataclasses import fields

from ... import tasks
from ...augment import AugmentHyp, albu
from ...devices import device_count
from ...loaders import list_loaders
from ...loaders.renders import OPTIONAL, renderer

# Ultralytics' own logger: messages appear where its users read its output, silenced on ranks > 0 as its are.
log = logging.getLogger("ultralytics").getChild("fastfeed")

LOADER_ENV = "FASTFEED_LOADER"
RAM_CACHE = {"true", "ram"}   # Ultralytics cache= values meaning a decoded copy in memory
_NO_CACHE = {"false", "disk", "none", ""}

# Ultralytics' augmentation arguments that fastfeed's AugmentHyp has under the same name and meaning.
# (hsv_h: theirs scales hue in OpenCV's 0..180 space, ours rotates it; same range, statistically close.)
# The OPTIONAL ones (`loaders.renders`) are honoured by the loaders that render them, else warned about and set to 0.
# Albumentations come from Ultralytics' `augmentations` (or its default list): `albumentations` below.
HYP_ARGS = ("mosaic", "mixup", "degrees", "translate", "scale", "shear", "fliplr", "flipud", "hsv_h", "hsv_s", "hsv_v",
            *(k for k in OPTIONAL if k != "albumentations"))


# The loaders FastfeedTrainer takes: uint8 host batches that Ultralytics' preprocess_batch moves and converts
# (cpu, shm, dali), and the device loader's, finished on the trainer's device already (device.py).
TRAINER_LOADERS = ("cpu", "shm", "dali", "device")


def loader_workers(requested: int, device) -> int:
    """Ultralytics' `workers` cap, honoured as its loader does: at most the cores per local device."""
    if device.type in ("cpu", "mps"):
        return requested     # the trainer has already set 0 on CPU: the model step dominates there
    return max(0, min(requested, (os.cpu_count() or 1) // max(device_count(device), 1)))


def loader_name(cache) -> str:
    """`cpu` or `shm` from Ultralytics' `cache` argument; FASTFEED_LOADER=cpu|shm|dali|device overrides it."""
    if name := os.environ.get(LOADER_ENV, "").strip():
        if name not in TRAINER_LOADERS:
            why = "not one FastfeedTrainer feeds from" if name in list_loaders() else "not a fastfeed loader"
            raise ValueError(f"{LOADER_ENV}={name!r}: {why}; valid: {', '.join(TRAINER_LOADERS)}")
        return name
    key = str(cache).strip().lower() if cache is not None else ""
    if key in RAM_CACHE:
        return "shm"      # one decoded copy per node, mapped by every rank and worker
    if key in _NO_CACHE:
        return "cpu"
    raise ValueError(f"cache={cache!r}: expected True/'ram' (fastfeed's shm loader), False or 'disk' (its cpu "
                     f"loader); or choose the loader with {LOADER_ENV}={'|'.join(TRAINER_LOADERS)}")


def _scale(value) -> float:
    """Ultralytics' `scale`: a gain s (zoom drawn from [1-s, 1+s], as ours) or an explicit (min, max)."""
    if not isinstance(value, (list, tuple)):
        return value
    lo, hi = (float(v) for v in value)
    s = max(1.0 - lo, hi - 1.0, 0.0)
    if abs((1.0 - lo) - (hi - 1.0)) > 1e-9:
        log.warning(f"fastfeed: scale={tuple(value)} is not centred on 1 and cannot be honoured: fastfeed draws the "
                    f"zoom from [1-s, 1+s]; training with s={s:g}")
    return s


def augment_hyp(args, loader: str = "cpu") -> AugmentHyp:
    """fastfeed's AugmentHyp from Ultralytics' arguments, for `loader` (the OPTIONAL augmentations its renderer does
    not draw set to 0: `unsupported` warns of them); a value out of fastfeed's range raises ValueError naming the
    Ultralytics argument."""
    drawn = renderer(loader).augmentations
    values = {name: getattr(args, name) if name in drawn or name not in OPTIONAL else 0.0 for name in HYP_ARGS}
    values["albumentations"] = albumentations(args)[0] if "albumentations" in drawn else ()
    values["copy_paste_mode"] = getattr(args, "copy_paste_mode", "flip")
    values["scale"] = _scale(values["scale"])
    try:
        return AugmentHyp(**values)
    except ValueError as e:
        raise ValueError(f"Ultralytics argument out of the range fastfeed supports: {e}") from None


def albumentations(args) -> tuple[list, list]:
    """(the pixel-level transforms, the spatial ones) of the Albumentations step Ultralytics' loader would build for
    `args` (its `Albumentations`: the user's `augmentations=[...]`, else its default list; nothing when albumentations
    is not installed, said once)."""
    try:
        from ultralytics.data.augment import Albumentations
    except ImportError:   # no Ultralytics: no default list to take
        return [], []
    given = getattr(args, "augmentations", None)
    step = _built.get(repr(given))
    if step is None:   # built (and logged by Ultralytics) once per list; so is the line below
        step = _built[repr(given)] = Albumentations(p=1.0, transforms=given)
        if step.transform is None:
            log.info("fastfeed: albumentations is not installed: training without Ultralytics' default "
                     "Albumentations (`pip install -e '.[albumentations]'` applies them)")
    if step.transform is None:
        return [], []
    transforms = [t for t in step.transform.transforms if t.p > 0]
    return [t for t in transforms if not albu.spatial(t)], [t for t in transforms if albu.spatial(t)]


_built: dict = {}


def task_fields(args, task: str) -> dict:
    """The LoaderConfig fields of a task's own arguments: segment's `mask_ratio` and `overlap_mask` (the masks the
    loader rasterises), drawn by Ultralytics' mask rule (why: docs/design.md, 'Masks are scan-converted at the
    reduced resolution'); pose's kpt_shape and flip_idx are the store's (checked against data.yaml: store.check_task).
    The batches carry the trainer's task: a detect trainer reads any store's boxes alone (nothing drawn for a loss
    that does not read it)."""
    masks = {"mask_ratio": int(args.mask_ratio), "overlap_mask": bool(args.overlap_mask), "mask_rule": "ultralytics"}
    return {"task": task, **(masks if tasks.get(task).extra == "masks" else {})}


def unsupported(args, task: str = "detect", loader: str = "cpu") -> list[str]:
    """One message per training argument (at a non-default value) that fastfeed's `loader` cannot honour."""
    drawn = renderer(loader).augmentations
    out = [f"{name}={getattr(args, name)}: the {loader} loader does not render it (the cpu and shm loaders do); "
           f"training without it" for name in OPTIONAL if (getattr(args, name, 0) or 0) and name not in drawn]
    masks = tasks.get(task).extra == "masks"
    if masks and getattr(args, "classes", None) is not None and getattr(args, "overlap_mask", False):
        out.append("classes=[...] with overlap_mask=True: fastfeed drops the other classes' objects after the masks are "
                   "drawn, so where one of them lay over a kept object that object's mask reads as background "
                   "(Ultralytics drops them before drawing); overlap_mask=False keeps every kept mask whole")
    pixel, spatial = albumentations(args) if "albumentations" in drawn or importlib.util.find_spec("albumentations") \
        else ([], [])
    if spatial:
        out.append(f"augmentations=[...]: {', '.join(type(t).__name__ for t in spatial)} move the image's geometry; "
                   f"fastfeed applies pixel-level Albumentations only: training without them")
    if pixel and "albumentations" not in drawn:
        out.append(f"Albumentations ({', '.join(type(t).__name__ for t in pixel)}): the {loader} loader does not apply "
                   f"them (the cpu and shm loaders do); training without them")
    if getattr(args, "rect", False):
        out.append("rect=True: fastfeed trains on square batches (as Ultralytics' own shuffled loader does)")
    return out


def train_count(args, n: int) -> int:
    """How many records Ultralytics' `fraction` trains on of a train split of `n` images: its rule
    (`get_split_fraction`: a ratio, or a count when an int), applied to the first records, as it keeps the first
    images of its sorted file list (a store packed from a folder holds them in that order)."""
    fraction = getattr(args, "fraction", 1.0)
    with contextlib.suppress(ImportError):  # older Ultralytics: a plain float
        from ultralytics.data.utils import get_split_fraction
        fraction = get_split_fraction(fraction, "train")
    count = fraction if isinstance(fraction, int) else max(1, round(n * fraction))
    return min(int(count), n)


def warn_unsupported(args, task: str = "detect", loader: str = "cpu") -> None:
    for message in unsupported(args, task, loader):
        log.warning(f"fastfeed: {message}")


def describe(hyp: AugmentHyp) -> str:
    return ", ".join([f"{f.name}={getattr(hyp, f.name)}" for f in fields(hyp) if f.name in HYP_ARGS] +
                     [f"albumentations={albu.names(hyp.albumentations)}"] * bool(hyp.albumentations))
