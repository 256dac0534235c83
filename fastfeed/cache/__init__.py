"""A decoded-image cache in shared memory, one per store and imgsz, shared by every process on the node.

The `shm` loader reads its images from here instead of decoding JPEGs: the first process that asks
builds the slab (all cores), every other one (workers, other ranks, other runs) maps the same
pages. See lease.py for its use, layout.py for the slab format, users.py for locking and reference counting.
"""

from .budget import CacheBudgetError
from .layout import CACHE_VERSION, slab_name
from .lease import CacheHandle, CacheLease, acquire
from .manage import CacheInfo, clear_caches, list_caches
from .users import CacheError

__all__ = ["CACHE_VERSION", "CacheBudgetError", "CacheError", "CacheHandle", "CacheInfo", "CacheLease", "acquire",
           "clear_caches", "list_caches", "slab_name"]
