"""Tell the dataset layouts apart and pick the split, with errors that say what was expected.

The layouts (docs/inputs.md, "Folders"): COCO (`annotations/instances_<split>.json` + `images/[<split>/]`, a flat
`<one>.json` + `images/`, or --ann FILE --images DIR), YOLO (`images/[<split>/]` + `labels/[<split>/]`),
Roboflow's split folders (`<split>/images/` + `<split>/labels/`, or `<split>/<one>.json`) and data.yaml's
folders. A folder holding both a COCO JSON and YOLO labels/ is not guessed: `--format coco|yolo` chooses.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .coco import read_coco
from .datayaml import data_yaml_in, labels_dir_for, read_data_yaml, read_names
from .source import IMAGE_SUFFIXES, PackError, Source
from .yolo import read_yolo

log = logging.getLogger(__name__)

COCO_HINT = ("COCO: SRC/annotations/instances_<split>.json + SRC/images/<split>/, or SRC/annotations.json + "
             "SRC/images/, or --ann FILE.json --images DIR")
YOLO_HINT = "YOLO: SRC/images/<split>/ + SRC/labels/<split>/*.txt, or SRC/images/ + SRC/labels/, or SRC/x.jpg + SRC/x.txt"
SPLITS_HINT = ("split folders (Roboflow's exports): SRC/<split>/images/ + SRC/<split>/labels/ (+ SRC/data.yaml), "
               "or SRC/<split>/<file>.json + its images; or a data.yaml file: fastfeed pack data.yaml [--split val]")


def layouts() -> str:
    """The layouts fastfeed reads, one per line, for error messages."""
    return f"  {COCO_HINT}\n  {YOLO_HINT}\n  {SPLITS_HINT}"


def _pick(splits: list[str], wanted: str | None, what: str) -> str:
    if wanted is not None:
        if wanted not in splits:
            raise PackError(f"split {wanted!r} not found in {what}; available: {', '.join(splits) or 'none'}")
        return wanted
    if len(splits) == 1:
        return splits[0]
    for default in ("train2017", "train"):
        if default in splits:
            return default
    raise PackError(f"{what} has several splits ({', '.join(splits)}); choose one with --split")


def _has_images(folder: Path) -> bool:
    return any(p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") for p in folder.iterdir() if p.is_file())


def jsons_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.json") if not p.name.startswith("."))


def _flat_coco(folder: Path) -> tuple[Path, Path] | None:
    """(the JSON, the images folder) of a flat COCO folder: one *.json beside images/ or data/ (FiftyOne's COCO
    export: labels.json + data/), or beside the images."""
    jsons = jsons_in(folder)
    if len(jsons) != 1:
        return None
    for images in (folder / "images", folder / "data"):
        if images.is_dir():
            return jsons[0], images
    return (jsons[0], folder) if _has_images(folder) else None


def _yolo_split_folders(src: Path) -> tuple[dict[str, Path], dict[str, PackError]]:
    """(split name -> images folder, split key -> why data.yaml's entry cannot be used; key '' for the whole
    file): data.yaml's train:/val:/test: entries, then the folders SRC/<name>/images/ by their names (so
    `--split val` and `--split valid` both find Roboflow's valid/)."""
    found, broken = {}, {}
    file = data_yaml_in(src)
    if file is not None:
        try:
            dy = read_data_yaml(file)
        except PackError as e:   # e.g. a `path:` of the machine it was made on: the folders may still be here
            broken[""] = e
        else:
            for key in dy.entries:
                try:
                    found[key] = dy.images(key)
                except PackError as e:   # one broken entry (a `val:` of another layout) spoils no other split
                    broken[key] = e
    for d in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (d / "images").is_dir() and d.name not in found:
            found[d.name] = (d / "images").resolve(), None
    if broken and not found:
        raise next(iter(broken.values()))
    return found, broken


def _looks_coco(file: Path) -> bool:
    try:
        data = file.read_bytes()
    except OSError:
        return False
    return b'"images"' in data and b'"annotations"' in data


def _two_layouts(folder: Path) -> str | None:
    """'a COCO JSON (X) and YOLO labels (Y)' when `folder` holds both: which one the user means is theirs to say
    (a COCO export with YOLO labels added, or the reverse: they need not agree). The JSON is looked for in
    `folder`, its annotations/, its images/ and images/<split>/ (Roboflow's `_annotations.coco.json`)."""
    labels = folder / "labels"
    if not labels.is_dir() or next(labels.rglob("*.txt"), None) is None:
        return None
    ann, images = folder / "annotations", folder / "images"
    places = [folder, images, *sorted(d for d in images.iterdir() if d.is_dir())] if images.is_dir() else [folder]
    jsons = sorted(ann.glob("instances_*.json")) + [j for d in places for j in jsons_in(d)]
    coco = next((j for j in jsons if _looks_coco(j)), None)
    return None if coco is None else f"a COCO JSON ({coco}) and YOLO labels ({labels}/)"


class TwoLayouts(PackError):
    """A folder holds both a COCO JSON and YOLO labels: --format must say which one is meant."""


def detect_format(src: Path) -> str:
    subdirs = [p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for folder in [src, *subdirs]:
        if (both := _two_layouts(folder)) is not None:
            raise TwoLayouts(f"{folder} holds two layouts, {both}, and they need not agree: choose one with "
                            "--format coco or --format yolo")
    if any((src / "annotations").glob("instances_*.json")):   # a glob in a folder that is not there finds nothing
        return "coco"
    if (src / "labels").is_dir():
        return "yolo"
    if _flat_coco(src) is not None:
        return "coco"
    if any((d / "images").is_dir() for d in subdirs) or (src / "images").is_dir():
        return "yolo"
    if any(_flat_coco(d) is not None for d in subdirs):
        return "coco"
    if (file := data_yaml_in(src)) is not None and read_data_yaml(file).entries:
        return "yolo"
    if _is_images_folder(src):   # SRC holds the images, or is e.g. data/images/train2017
        return "yolo"
    raise PackError(f"cannot tell the layout of {src}: expected\n{layouts()}\nor pass --format coco|yolo")


def _coco(src: Path, split: str | None, task: str) -> Source:
    files = sorted((src / "annotations").glob("instances_*.json"))
    if files:
        splits = [f.stem[len("instances_"):] for f in files]
        split = _pick(splits, split, f"{src / 'annotations'}")
        # images/<split>/, <split>/, or images/ itself (CVAT's COCO export: annotations/instances_default.json)
        images = next((d for d in (src / "images" / split, src / split, src / "images") if d.is_dir()), None)
        if images is None:
            raise PackError(f"images folder for split {split!r} not found: expected {src / 'images' / split}/ or "
                            f"{src / 'images'}/")
        return read_coco(src / "annotations" / f"instances_{split}.json", images, split, src, task)
    flat = _flat_coco(src)
    if flat is not None and split is None:
        return read_coco(flat[0], flat[1], None, src, task)
    folders = {d.name: f for d in sorted(src.iterdir()) if d.is_dir() and (f := _flat_coco(d)) is not None}
    if folders:
        split = _pick(sorted(folders), split, f"{src} (split folders)")
        return read_coco(*folders[split], split, src, task)
    raise PackError(f"no COCO annotations in {src}: expected {COCO_HINT}{_ann_suggestion(src)}")


def _ann_suggestion(src: Path) -> str:
    """`; try --ann X --images Y` for the JSON files near SRC, so a layout fastfeed does not guess still packs."""
    jsons = jsons_in(src) + [j for d in sorted(src.iterdir()) if d.is_dir() for j in jsons_in(d)]
    if not jsons:
        return ""
    images = next((d for d in (src / "images", jsons[0].parent / "images", jsons[0].parent) if d.is_dir()), src)
    return f"; for {jsons[0]}, try: fastfeed pack --ann {jsons[0]} --images {images} -o OUT"


def _yolo(src: Path, split: str | None, names: list[str] | None) -> Source:
    images = src / "images"
    if images.is_dir():
        subdirs = sorted(p.name for p in images.iterdir() if p.is_dir())
        if split is None and _has_images(images):
            return read_yolo(images, src / "labels", src, names=names)
        if not subdirs:
            raise PackError(f"{images} holds no images and no split folders; expected {YOLO_HINT}")
        split = _pick(subdirs, split, str(images))
        return read_yolo(images / split, src / "labels" / split, src, split, names)
    if split is None and _is_images_folder(src):   # SRC is the images folder itself (e.g. data.yaml's train:)
        return _images_folder(src, None, None, names)
    folders, broken = _yolo_split_folders(src)
    if split in broken and split not in folders:
        raise PackError(f"{broken[split]}; or pack one of the split folders found in {src}: --split "
                        f"{' | '.join(folders)}")
    if "" in broken:
        log.warning("%s; using the split folders found in %s instead", broken[""], src)
    if folders:
        split = _pick(list(folders), split, f"{src} (split folders and data.yaml)")
        return _images_folder(folders[split][0], src, split, names if names is not None else read_names(src),
                              files=folders[split][1])
    raise PackError(f"no images/ folder in {src}, and no split folders; expected\n{layouts()}")


def _is_images_folder(src: Path) -> bool:
    """SRC holds the images itself: images directly in it, or it is named by Ultralytics' rule (a folder on
    its path is `images`) and its labels folder exists."""
    return _has_images(src) or ((labels := labels_dir_for(src)) is not None and labels.is_dir())


def _images_folder(images: Path, root: Path | None, split: str | None, names: list[str] | None,
                   pose: tuple | None = None, files: list[Path] | None = None) -> Source:
    """The YOLO source of an images folder; `root` None: the folder holding its `images` folder (the split is
    the path below it: coco128/images/train2017 -> root coco128, split train2017). In a path without an `images`
    folder each label file sits beside its image, as Ultralytics reads it (CVAT's YOLO 1.1, labelImg)."""
    labels = labels_dir_for(images)
    if labels is not None and root is None:
        k = len(images.parts) - 1 - images.parts[::-1].index("images")
        root, split = Path(*images.parts[:k]), "/".join(images.parts[k + 1:]) or None
    return read_yolo(images, labels or images, root or images, split, names, pose, files)


def _from_data_yaml(file: Path, format: str | None, split: str | None, names: list[str] | None) -> Source:
    if format not in (None, "yolo"):
        raise PackError(f"{file} is Ultralytics' data.yaml, a YOLO dataset; drop --format {format}")
    dy = read_data_yaml(file)
    if not dy.entries:
        raise PackError(f"{file} names no split (train:, val: or test:); give the dataset folder instead")
    images, files = dy.images(key := _pick(list(dy.entries), split, str(file)))
    return _images_folder(images, dy.root, key, names if names is not None else dy.names, dy.pose, files)


def _explicit_coco(ann: Path | None, images: Path | None, format: str | None, split: str | None,
                   task: str) -> Source:
    if ann is None or images is None:
        raise PackError("--ann and --images go together: give the COCO JSON file and its images folder")
    if format not in (None, "coco"):
        raise PackError("--ann/--images describe a COCO dataset; drop --format yolo")
    ann, images = Path(ann), Path(images)
    if ann.is_dir():
        raise PackError(f"--ann {ann} is a folder; --ann takes the COCO JSON file (e.g. {ann}/annotations.json) and "
                        "--images the folder of images")
    if not ann.exists():
        raise PackError(f"--ann {ann}: annotation file not found")
    if images.is_file():
        raise PackError(f"--images {images} is a file; --images takes the folder that holds the images "
                        "(--ann takes the JSON file)")
    if not images.is_dir():
        raise PackError(f"--images {images}: images folder not found")
    return read_coco(ann, images, split, task=task)


def open_source(src: Path | None, format: str | None = None, split: str | None = None,
                ann: Path | None = None, images: Path | None = None, names: list[str] | None = None,
                task: str | None = None) -> Source:
    """Read the dataset at `src` (a folder or a data.yaml; or the explicit `ann` + `images` pair) into a
    `Source`. `names`: class names for a YOLO source (data.yaml's), instead of reading them from the folder.
    `task`: what a COCO source keeps of each annotation besides its box (segment: `segmentation`, pose:
    `keypoints`); a YOLO source's lines are read for it in the pack workers."""
    if ann is not None or images is not None:
        if src is not None:
            raise PackError(f"give SRC ({src}) or --ann/--images, not both")
        return _explicit_coco(ann, images, format, split, task or "detect")
    if src is None:
        raise PackError("no dataset given: pass SRC (a COCO or YOLO folder, or a data.yaml) or --ann FILE --images DIR")
    src = Path(src)
    if src.is_file() and src.suffix.lower() in (".yaml", ".yml"):
        return _from_data_yaml(src, format, split, names)
    if src.is_file() and src.suffix.lower() == ".json":
        raise PackError(f"{src} is a JSON file: for a COCO file, give it with its images folder: "
                        f"fastfeed pack --ann {src} --images DIR -o OUT")
    if not src.is_dir():
        what = "is a file, not a directory" if src.exists() else "does not exist"
        raise PackError(f"{src} {what}; expected a dataset folder or a data.yaml:\n{layouts()}")
    format = format or detect_format(src)
    if format == "coco":
        return _coco(src, split, task or "detect")
    if format == "yolo":
        return _yolo(src, split, names)
    raise PackError(f"unknown --format {format!r}; valid: coco, yolo")
