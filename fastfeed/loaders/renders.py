"""Which task a loader's batches carry (`batch_task`: the store's own, or detection's boxes alone), what each
renderer draws, and every refusal a loader makes from them (`Renders.refuse`, called by `Loader.__init__`
before any set-up): docs/design.md, 'One declaration per renderer'. `OPTIONAL` are the `AugmentHyp` fields beyond
the base plan (mosaic, the affine, flips, HSV) that a renderer may not draw. (`fraction` is no renderer's: a subset
of the records, the loader's order, which every loader takes.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..augment.albu import names
from ..tasks import TASKS
from ..tasks import get as task_spec


class UnsupportedTask(ValueError):
    """A loader asked to read a store whose task geometry (polygons, keypoints, oriented boxes) it cannot carry."""


def store_task(store) -> str:
    """The task of `store`'s records (its manifest's; 'detect' for a source that says nothing)."""
    return getattr(getattr(store, "manifest", None), "task", None) or "detect"


def batch_task(store, cfg=None, setting: str = "LoaderConfig.task") -> str:
    """The task of the batches a loader of `store` makes under `cfg` (a LoaderConfig, or None): `cfg.task` when
    given, else the store's. 'detect' reads boxes only from a store of any task (a detection model trained on a
    segment, pose or OBB store: nothing drawn that it would not use); any other task must be the store's (a
    ValueError naming both, and the `setting` that asked: a command names its flag)."""
    held = store_task(store)
    asked = getattr(cfg, "task", None)
    if asked is None or asked == held or task_spec(asked, setting).field is None:   # boxes alone: from any store
        return asked or held
    raise ValueError(f"{setting} {asked!r}: {getattr(store, 'path', None) or store} is a store of {held} labels; its "
                     f"batches can carry its own task ({held}) or boxes alone ('detect'); pack the dataset with "
                     f"--task {asked} for {task_spec(asked).words}")


# The AugmentHyp fields (a probability or gain; 0: off) that not every renderer draws.
OPTIONAL = ("mixup", "cutmix", "copy_paste", "perspective", "bgr", "albumentations")


class UnsupportedAugmentation(ValueError):
    """A loader asked for an augmentation (a nonzero `AugmentHyp` field in OPTIONAL) its renderer does not draw."""


@dataclass(frozen=True)
class Renders:
    """What the renderer of `loaders` draws."""

    loaders: tuple[str, ...]
    tasks: tuple[str, ...]
    augmentations: frozenset     # the OPTIONAL fields it renders
    object_masks: bool           # a segment store's masks one per object (overlap_mask=False)

    def refuse(self, store, cfg) -> None:
        """UnsupportedTask or UnsupportedAugmentation naming what this renderer does not draw of what `cfg` asks
        of `store`, and the loaders that do; nothing when it draws it all."""
        task, name, where = batch_task(store, cfg), self.loaders[0], getattr(store, "path", None) or store
        spec = task_spec(task)
        if task not in self.tasks:
            raise UnsupportedTask(f"the {name} loader cannot carry the {spec.words} of {task} store "
                                  f"{where}; use the {_loaders(lambda r: task in r.tasks)} loader, or "
                                  f"task='detect' for its boxes alone")
        if spec.extra == "masks" and not cfg.overlap_mask and not self.object_masks:
            raise UnsupportedTask(f"the {name} loader makes a segment store's masks only with overlap_mask=True (one "
                                  f"int16 mask per image; one mask per object would cross the worker queue and the "
                                  f"bus for every object): set overlap_mask=True, or use the "
                                  f"{_loaders(lambda r: r.object_masks)} loader for {where}")
        missing = [k for k in asked(cfg.hyp) if k not in self.augmentations]
        if cfg.augment and missing:
            said = ", ".join(f"{k}={_value(cfg.hyp, k)}" for k in missing)
            raise UnsupportedAugmentation(f"the {name} loader does not render {said}: set "
                                          f"{'them' if len(missing) > 1 else 'it'} to 0, or use the "
                                          f"{_loaders(lambda r: set(missing) <= r.augmentations)} loader")


def asked(hyp) -> list[str]:
    """The OPTIONAL augmentations `hyp` turns on (nonzero)."""
    return [k for k in OPTIONAL if getattr(hyp, k)]


CPU = Renders(("cpu", "shm"), TASKS, frozenset(OPTIONAL), True)        # augment.render_labels, mix_in, finish_pixels
DEVICE = Renders(("device",), TASKS, frozenset({"perspective", "bgr"}), False)   # loaders/device/render.py
DALI = Renders(("dali",), TASKS[:1], frozenset({"mixup"}), False)      # loaders/dali/loader.py: boxes only (detect)
RENDERERS = (CPU, DEVICE, DALI)


def _value(hyp, k: str) -> str:
    return f"[{names(hyp.albumentations)}]" if k == "albumentations" else str(getattr(hyp, k))


def renderer(loader: str) -> Renders:
    """The declaration of the renderer behind loader `loader` (a registered name)."""
    for r in RENDERERS:
        if loader in r.loaders:
            return r
    raise ValueError(f"no renderer declares loader {loader!r}; declared: "
                     f"{', '.join(n for r in RENDERERS for n in r.loaders)}")


def _loaders(fits) -> str:
    names = [n for r in RENDERERS if fits(r) for n in r.loaders]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
