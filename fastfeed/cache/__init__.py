"""The shm cache: decoded images in shared memory, one slab per store and imgsz, shared by every process on the
node (docs/design.md, "The shm cache is one file per node"). lease.py: its use; layout.py: the slab format;
users.py: locking and reference counting."""

from .budget import CacheBudgetError
from .layout import CACHE_VERSION, slab_name
from .lease import CacheHandle, CacheLease, acquire
from .manage import CacheInfo, clear_caches, list_caches
from .users import CacheError

__all__ = ["CACHE_VERSION", "CacheBudgetError", "CacheError", "CacheHandle", "CacheInfo", "CacheLease", "acquire",
           "clear_caches", "list_caches", "slab_name"]
