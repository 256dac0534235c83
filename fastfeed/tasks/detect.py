"""detect: boxes and classes only; a record holds no geometry section's values, a Batch no extra."""

from __future__ import annotations

from .base import Task

DETECT = Task()
