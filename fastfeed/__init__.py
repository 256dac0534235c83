"""fastfeed: keep a detection trainer's accelerator fed.

Pack a COCO or YOLO dataset once (`fastfeed pack`), read it at random from any process (`Store`),
feed it through a loader into the device. See docs/design.md for the data flow.
"""

import os
from importlib import resources
from pathlib import Path

__version__ = "0.1.0"
# Set at the door, not where albumentations is imported (augment/albu.py): its import would otherwise ask the
# network for a newer version (2 s each process, offline). A user's own value wins.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def sample_path() -> Path:
    """The small COCO-layout sample shipped inside the package (16 CC-licensed COCO images)."""
    return Path(str(resources.files("fastfeed") / "sample_data" / "coco16"))


def __getattr__(name):
    # Lazy re-exports: `import fastfeed` stays cheap in worker processes and CLI start-up.
    if name in ("Store", "Sample"):
        from . import store

        return getattr(store, name)
    raise AttributeError(f"module 'fastfeed' has no attribute {name!r}")


__all__ = ["Store", "Sample", "sample_path", "__version__"]
