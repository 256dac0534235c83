"""Read an Ultralytics/YOLO dataset: an images folder and its labels folder (`images/<split>/` +
`labels/<split>/*.txt`, `<split>/images/` + `<split>/labels/`, ...), class names from data.yaml."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from .datayaml import labels_dir_for, read_names, read_pose
from .report import Problem
from .source import IMAGE_SUFFIXES, Item, Listing, Source, list_folder


def read_yolo(images_dir: Path, labels_dir: Path, root: Path, split: str | None = None,
              names: list[str] | None = None, pose: tuple | None = None, files: list[Path] | None = None) -> Source:
    """`names`: the class names (data.yaml's); None: read from a data.yaml in `root`, else the label ids.
    `pose`: data.yaml's (kpt_shape, flip_idx); None: read from a data.yaml in `root`. `files`: the images under
    `images_dir` that data.yaml lists (`DataYaml.images`), None: all; each one's label file by Ultralytics' rule."""
    gone = sorted(f for f in files or () if not f.exists())   # a listed image that is missing counts only as missing
    listing = list_folder(images_dir) if files is None else Listing(sorted(set(files) - set(gone)), [], [])
    items, problems = [], [*listing.repeats, *(Problem("missing_image", str(f.relative_to(images_dir)),
                                                        f"{f} does not exist") for f in gone)]
    rel = [p.relative_to(images_dir) for p in listing.images]
    # Numeric stems (COCO-style file names) become the image ids; otherwise the position.
    stems = [p.stem for p in rel]
    numeric = all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems)
    sharing = defaultdict(list)   # label file -> the images that take it (a.jpg and a.png, or a.JPG: a.txt)
    label_of = [((labels_dir_for(p.parent) or p.parent) / p.name).with_suffix(".txt") for p in listing.images]
    for r, label in zip(rel, label_of):
        sharing[label].append(r)
    for k, (path, r, label) in enumerate(zip(listing.images, rel, label_of)):
        if len(sharing[label]) > 1 and label.is_file():
            problems.append(Problem("ambiguous_label", str(r), (
                f"{' and '.join(map(str, sharing[label]))} share the label file {os.path.relpath(label, root)}: its "
                "boxes cannot be for all of them, so none is packed; rename the images so each has a label file of "
                "its own")))
            continue
        items.append(Item(path=path, name=str(r), image_id=int(r.stem) if numeric else k,
                          label_path=label if label.is_file() else None))
    if labels_dir.is_dir() and files is None:   # a list's folders hold the labels of other splits too
        labels = list_folder(labels_dir)
        problems += labels.repeats
        unlisted = {p.relative_to(images_dir).with_suffix(""): p.relative_to(images_dir) for p in listing.others
                    if p.suffix != ".txt"}   # labels beside their images are no unlisted image
        for label in labels.others:
            if label.suffix != ".txt" or label in sharing:
                continue
            r = label.relative_to(labels_dir)
            image = unlisted.get(r.with_suffix(""))
            if image is None:
                problems.append(Problem("label_without_image", str(r)))
            else:  # the image is there, under a name fastfeed does not list
                problems.append(Problem("unsupported_format", str(image), (
                    f"{image.suffix or 'no extension'} is not an image extension fastfeed lists "
                    f"({' '.join(sorted(IMAGE_SUFFIXES))}); its label {r} is unused: convert the image to PNG or JPEG")))
    names = list(names) if names is not None else (read_names(root) or [])
    kpt_shape, flip_idx = pose if pose is not None else read_pose(root)
    return Source("yolo", root, split, items, names, list(range(len(names))), problems, [],
                  labels_dir if files is None else None, kpt_shape, flip_idx)
