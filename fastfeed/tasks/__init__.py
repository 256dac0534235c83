"""The task registry: one module per task (detect, segment, pose, obb), each the one description of its task: what a
record holds beside its boxes and classes and everything that follows from it (the list: docs/design.md, 'Who owns
what', tasks/; why: 'One description per task, one build loop'). Callers ask `get(name)` / `REGISTRY` and compare
no task name. Pure numpy, importable by every layer.
"""

from __future__ import annotations

from .base import Task
from .detect import DETECT
from .obb import OBB
from .pose import POSE
from .segment import SEGMENT

#: Every task, in its record task-id order (format version 4 stores the index): append, never reorder.
REGISTRY: tuple[Task, ...] = (DETECT, SEGMENT, POSE, OBB)
TASKS: tuple[str, ...] = tuple(t.name for t in REGISTRY)
#: The tasks with geometry beside the boxes (every one but detect), in registry order.
GEOMETRY_TASKS: tuple[Task, ...] = tuple(t for t in REGISTRY if t.field is not None)


def get(name: str, setting: str = "task") -> Task:
    """The task called `name`; a ValueError naming the `setting` and the choices for any other."""
    for t in REGISTRY:
        if t.name == name:
            return t
    raise ValueError(f"{setting} must be one of {', '.join(TASKS)}, got {name!r}")


def by_id(task_id: int) -> Task | None:
    """The task a record's task id names (None for an id no registered task has)."""
    return REGISTRY[task_id] if 0 <= task_id < len(REGISTRY) else None


__all__ = ["GEOMETRY_TASKS", "REGISTRY", "TASKS", "Task", "by_id", "get"]
