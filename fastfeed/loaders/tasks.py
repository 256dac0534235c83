"""Which task a loader's batches carry: the store's own (segment polygons, pose keypoints, OBB corners beside the
boxes) or detection's boxes alone (`LoaderConfig.task="detect"`), decided in one place (`batch_task`) for every
loader, builder and planner; and what a loader that cannot carry a task raises (`UnsupportedTask`)."""

from __future__ import annotations

from ..tasks import get


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
    if asked is None or asked == held or get(asked, setting).field is None:   # boxes alone: from any store
        return asked or held
    raise ValueError(f"{setting} {asked!r}: {getattr(store, 'path', None) or store} is a {held} store; its "
                     f"batches can carry its own task ({held}) or boxes alone ('detect'); pack the dataset with "
                     f"--task {asked} for {get(asked).words}")
