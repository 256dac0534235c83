"""The task registry (`fastfeed/tasks/`): every task's description in one module, and nothing outside it switching on
a task's name (issue 34: 73 such switches in 23 files before the registry)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed import tasks
from fastfeed.store.format import RecordCorrupt

PKG = Path(fastfeed.__file__).parent
# No module outside fastfeed/tasks/ compares a task's name (each one found is listed when this fails); 74 in 25 files
# did before the registry (d16694b).
MAX_SWITCHES = 0


def task_switches(source: str) -> list[int]:
    """Line numbers of the comparisons (==, !=, in, not in), match cases and dict literals that name a task."""
    names = set(tasks.TASKS)

    def named(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(named(x) for x in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and named(node.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_switch_counter_sees_each_kind_of_switch():
    src = ('if task == "segment": pass\nif t in ("pose", "obb"): pass\nx = {"obb": 1}\n'
           'match t:\n    case "detect": pass\nif name == "person": pass\n')
    assert task_switches(src) == [1, 2, 3, 5]


def test_nothing_outside_the_registry_switches_on_a_task_name():
    found = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG)
        if rel.parts[0] != "tasks" and (lines := task_switches(p.read_text())):
            found[str(rel)] = lines
    total = sum(map(len, found.values()))
    assert total <= MAX_SWITCHES, (f"{total} switches on a task name outside fastfeed/tasks/ (at most {MAX_SWITCHES}): "
                                   f"{found}; ask the registry (fastfeed.tasks.get(name)) instead")


def test_the_registry_is_the_lowest_layer():
    """store/, augment/ and pack/ ask it: it imports nothing of fastfeed's but itself (and no torch)."""
    for p in (PKG / "tasks").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1 and (node.module or "") != "torch", f"{p.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert all(a.name in ("numpy",) for a in node.names), f"{p.name} imports {[a.name for a in node.names]}"


def test_record_task_ids_are_the_registry_order_and_unknown_names_are_named():
    assert tasks.TASKS == ("detect", "segment", "pose", "obb")   # format version 4 stores the index: never reorder
    assert [tasks.by_id(i).name for i in range(4)] == list(tasks.TASKS) and tasks.by_id(4) is None
    with pytest.raises(ValueError, match=r"--task must be one of detect, segment, pose, obb, got 'keypoint'"):
        tasks.get("keypoint", "--task")


GEOMETRY = {"segment": [np.float32([[0.1, 0.1], [0.5, 0.1], [0.3, 0.4]]), np.zeros((0, 2), np.float32)],
            "pose": np.float32([[[0.2, 0.3, 2], [0.0, 0.0, 0]], [[0.6, 0.7, 1], [0.5, 0.5, 2]]]),
            "obb": np.float32([[[0.1, 0.1], [0.4, 0.1], [0.4, 0.3], [0.1, 0.3]]] * 2)}


@pytest.mark.parametrize("name", ["segment", "pose", "obb"])
def test_each_task_round_trips_its_record_section_and_refuses_a_short_one(name):
    spec = tasks.get(name)
    k, d, section = spec.encode(2, GEOMETRY[name])
    value, off = spec.parse(section + b"tail", 0, k, d, 2, RecordCorrupt)
    assert off == len(section)
    for a, b in zip(value, GEOMETRY[name]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(RecordCorrupt):
        spec.parse(section[:-4], 0, k, d, 2, RecordCorrupt)
    with pytest.raises(ValueError, match="for 3 objects"):
        spec.encode(3, GEOMETRY[name])


def test_detect_has_no_geometry_section():
    spec = tasks.get("detect")
    assert spec.encode(2, None) == (0, 0, b"") and spec.parse(b"x", 0, 0, 0, 2, RecordCorrupt) == (None, 0)
    assert spec.field is None and spec.extra is None and tasks.GEOMETRY_TASKS == tasks.REGISTRY[1:]


@pytest.mark.parametrize("name", ["segment", "pose", "obb"])
def test_each_task_checks_a_record_against_its_boxes_and_the_image(name):
    class M:
        kpt_shape = [2, 3]

    spec = tasks.get(name)
    assert spec.check_record(GEOMETRY[name], 2, M) is None
    assert spec.check_record(GEOMETRY[name], 3, M)                         # a count that is not the boxes'
    moved = spec.map_points(GEOMETRY[name], lambda p: p + 1.0)             # every point outside 0..1
    assert spec.check_record(moved, 2, M)


def test_field_operations_keep_objects_in_order():
    seg, pose = tasks.get("segment"), tasks.get("pose")
    joined = seg.join([GEOMETRY["segment"], GEOMETRY["segment"][:1]])
    assert len(joined) == 3 and [len(p) for p in seg.take(joined, np.array([2, 1]))] == [3, 0]
    scaled = pose.to_pixels(GEOMETRY["pose"], np.float32([100, 10]))
    np.testing.assert_allclose(scaled[0, 0], [20, 3, 2])                     # visibility is not scaled
    assert pose.counts(list(GEOMETRY["pose"])) == {"posed": 2, "keypoints_labelled": 3}
    with pytest.raises(ValueError, match="keypoints of different shapes"):
        pose.join([GEOMETRY["pose"], np.zeros((1, 3, 3), np.float32)])


def test_the_old_record_field_name_still_reads_with_a_warning(tmp_path):
    from fastfeed.store.record import encode_record, parse_record

    buf = encode_record(codec="raw", height=1, width=1, orig_height=1, orig_width=1, image_id=1, file_name="a",
                        boxes=np.float32([[0, 0, 1, 1]] * 2), classes=np.array([0, 0]), crowd_boxes=np.zeros((0, 4)),
                        crowd_classes=np.zeros(0), payload=bytes(3), task="obb", geometry=GEOMETRY["obb"])
    r = parse_record(buf, 0, "s")
    with pytest.warns(DeprecationWarning, match="Record.obb is deprecated: use Record.corners"):
        np.testing.assert_array_equal(r.obb, GEOMETRY["obb"])
    assert r.geometry is r.corners
