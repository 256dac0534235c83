"""Ultralytics' `data.yaml`: the class names, and the split folders (`train:`, `val:`, `test:`) resolved as
Ultralytics resolves them, so `fastfeed pack data.yaml` packs the folder Ultralytics would train on.

    path: ../datasets/coco128      # the splits' root: from the working directory, else the yaml's folder (default)
    train: images/train2017        # or `../train/images` (Roboflow), a list of folders, a file listing images
    val: images/val2017
    names: {0: person, 1: bicycle} # or a list; `nc`, when given, must be its length
    kpt_shape: [17, 3]             # a pose set: keypoints per object, values per keypoint (x, y[, visibility])
    flip_idx: [0, 2, 1, ...]       # a pose set: the keypoint each one becomes in a left-right flip

A label file's path is its image's with the last `images` folder of the path replaced by `labels` (`labels_dir_for`),
Ultralytics' rule: `images/train2017/x.jpg` -> `labels/train2017/x.txt`, `train/images/x.jpg` -> `train/labels/x.txt`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..checks import is_int
from .source import IMAGE_SUFFIXES, PackError, list_folder

SPLIT_KEYS = ("train", "val", "test")


def load_yaml(file: Path) -> dict:
    import yaml

    try:
        cfg = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise PackError(f"{file} is not valid YAML: {e}") from None
    except OSError as e:
        raise PackError(f"cannot read {file}: {e.strerror or e}") from None
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise PackError(f"{file}: expected a mapping (names:, train:, val:), got {type(cfg).__name__}")
    return cfg


def names_of(cfg: dict, file: Path) -> list[str] | None:
    """Class names of a data.yaml mapping ('names' as a list or an {id: name} mapping); None when absent."""
    names, nc = cfg.get("names"), cfg.get("nc")
    if names is None:   # `nc` alone: Ultralytics names the classes class_0 .. class_<nc-1>
        return [f"class_{k}" for k in range(nc)] if is_int(nc) and nc > 0 else None
    if isinstance(names, dict):   # a key '0' is class 0, as Ultralytics reads it (int(k))
        names = {int(k) if str(k).isdigit() else k: v for k, v in names.items()}
        if set(names) != set(range(len(names))):
            raise PackError(f"{file}: 'names' keys must be 0..N-1, got {list(names)[:10]}")
        names = [names[k] for k in range(len(names))]
    elif not isinstance(names, list):
        raise PackError(f"{file}: 'names' must be a list or a {{id: name}} mapping")
    if nc is not None and nc != len(names):
        raise PackError(f"{file}: nc is {nc} but 'names' lists {len(names)} classes; make them agree")
    for k, n in enumerate(names):   # a name is text (or a number, read as text): not empty, not a list or mapping
        if n is None or isinstance(n, (list, dict)) or not str(n).strip():
            raise PackError(f"{file}: class {k}'s name is {n!r}; give every class in 'names' a name")
    return [str(n) for n in names]


def pose_of(cfg: dict, file: Path) -> tuple[list[int] | None, list[int] | None]:
    """(kpt_shape [K, D], flip_idx) of a data.yaml mapping, each None when absent; a malformed one stops the pack
    (Ultralytics' trainer refuses a flip_idx whose length is not K, too)."""
    shape, flip = cfg.get("kpt_shape"), cfg.get("flip_idx")
    if shape is None:
        if flip is not None:
            raise PackError(f"{file}: flip_idx without kpt_shape; add `kpt_shape: [K, 2 or 3]` (a pose set) or remove "
                            "flip_idx")
        return None, None
    if (not isinstance(shape, list) or len(shape) != 2 or not all(type(v) is int for v in shape)
            or shape[0] < 1 or shape[1] not in (2, 3)):
        raise PackError(f"{file}: kpt_shape {shape!r} is not [K, 2 or 3] (K keypoints of x, y or x, y, visibility)")
    if flip is not None and (not isinstance(flip, list) or sorted(flip) != list(range(shape[0]))):
        raise PackError(f"{file}: flip_idx {flip!r} is not an order of the {shape[0]} keypoints 0..{shape[0] - 1} "
                        "(kpt_shape's K): fix it, each keypoint's left-right counterpart")
    return list(shape), (list(flip) if flip is not None else None)


def read_pose(root: Path) -> tuple[list[int] | None, list[int] | None]:
    """(kpt_shape, flip_idx) of the data.yaml in root (`data_yaml_in`); (None, None) without one."""
    file = data_yaml_in(root)
    return (None, None) if file is None else pose_of(load_yaml(file), file)


def data_yaml_in(root: Path) -> Path | None:
    """`root/data.yaml`, else the only *.yaml in root; None when there is none (or several)."""
    if (root / "data.yaml").is_file():
        return root / "data.yaml"
    candidates = sorted(root.glob("*.yaml"))
    return candidates[0] if len(candidates) == 1 else None


def read_names(root: Path) -> list[str] | None:
    """Class names from `data.yaml` (or the only *.yaml) in root; None when there is none."""
    file = data_yaml_in(root)
    return None if file is None else names_of(load_yaml(file), file)


def labels_dir_for(images_dir: Path) -> Path | None:
    """Where the label files of `images_dir` are, by Ultralytics' rule (its last `images` folder becomes
    `labels`); None when no folder of the path is named `images`."""
    parts = images_dir.parts
    for k in range(len(parts) - 1, -1, -1):
        if parts[k] == "images":
            return Path(*parts[:k], "labels", *parts[k + 1:])
    return None


def single(value) -> tuple[object, int]:
    """A split entry, one folder or a list of them -> (the folder, or None when the list does not hold exactly
    one; how many were listed)."""
    if isinstance(value, (list, tuple)):
        return (value[0] if len(value) == 1 else None), len(value)
    return value, 1


@dataclass
class DataYaml:
    file: Path
    root: Path                      # what the split paths are relative to
    names: list[str] | None
    entries: dict[str, object]      # split key -> its value in the file (a path, a list, ...)
    pose: tuple = (None, None)      # (kpt_shape, flip_idx): `pose_of`

    def folder(self, key: str) -> Path:
        return self.images(key)[0]

    def images(self, key: str) -> tuple[Path, list[Path] | None]:
        """Split `key`'s images as Ultralytics resolves them (a `../x` that does not exist beside the root taken inside
        it: Roboflow's `../train/images`): (its folder, None); for a list of folders or a file listing images (./x from
        its folder, another relative path from the working directory), (the folder holding them all, the images)."""
        paths, files = [], []
        for value in map(str, v if isinstance(v := self.entries[key], (list, tuple)) else [v]):
            path = Path(value) if Path(value).is_absolute() else self.root / value
            if not path.exists() and value.startswith("../"):
                path = self.root / value[3:]
            if not path.exists():
                raise PackError(f"{self.file}: '{key}: {value}' does not exist (looked for {path.resolve()}); fix the "
                                f"'{key}:' entry (relative to {self.root.resolve()})")
            paths.append(path.resolve())
        if len(paths) == 1 and paths[0].is_dir():
            return paths[0], None
        for path in paths:
            try:
                listed = list_folder(path).images if path.is_dir() else path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise PackError(f"{self.file}: cannot read '{key}:' {path} (a list of images: UTF-8 text, a path a "
                                f"line): {e}") from None
            files += [Path(os.path.abspath(path.parent / x[2:] if x.startswith("./") else x)) for x in
                      map(str.strip, map(str, listed)) if Path(x).suffix.lower() in IMAGE_SUFFIXES]
        if not any(f.is_file() for f in files):
            raise PackError(f"{self.file}: '{key}:' lists {len(files)} image(s), none found"
                            f"{f' (e.g. {files[0]})' if files else ''}; in a list file ./x is taken from its folder, "
                            "another relative path from the working directory (as Ultralytics reads it): fix the paths")
        files = sorted(set(files))
        return Path(os.path.commonpath(list({f.parent for f in files}))), files


def read_data_yaml(file: Path) -> DataYaml:
    cfg = load_yaml(file)
    names = names_of(cfg, file)
    root = base = file.parent
    if cfg.get("path"):
        p = Path(str(cfg["path"]))
        tried = [p] if p.is_absolute() else [Path.cwd() / p, base / p]   # Ultralytics' first, then ours
        found = [t for t in tried if t.is_dir()]
        if not found:
            raise PackError(f"{file}: 'path: {cfg['path']}' is not a folder (looked in "
                            f"{', '.join(str(t.resolve()) for t in tried)}); fix it or remove it (the splits are then "
                            f"relative to {base.resolve()})")
        root = found[0]
    entries = {k: cfg[k] for k in SPLIT_KEYS if cfg.get(k)}
    return DataYaml(file, root, names, entries, pose_of(cfg, file))
