"""Packing a COCO or YOLO dataset into a checked, versioned store (`fastfeed pack`)."""

from .config import PackConfig
from .process import EXIF_MODES, STORE_MODES
from .run import PackResult, pack
from .source import PackError

__all__ = ["pack", "PackConfig", "PackResult", "PackError", "STORE_MODES", "EXIF_MODES"]
