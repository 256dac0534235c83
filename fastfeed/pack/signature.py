"""A cheap "has the source changed since it was packed?" check, without reading any image.

`Manifest.source_fingerprint` hashes the contents of every source file, so it can only be computed by packing again.
`source_signature()` hashes what a re-pack would read, as file metadata: the layout reader's list of images
(`open_source`, the same one `pack()` uses), each image's and label file's relative name, size and modification time,
the annotation files' too, and the class names. Adding, removing, replacing or editing an image or a label changes it; a
second over the same files costs one `stat` per file. (Like any metadata check, it misses an edit that keeps a file's
size and restores its modification time.)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..store import format as fmt
from .layout import open_source


def _stat(path: Path | None, root: Path) -> str:
    if path is None:
        return "-"
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:missing"
    try:
        name = path.relative_to(root)
    except ValueError:
        name = path
    return f"{name}:{st.st_size}:{st.st_mtime_ns}"


def source_signature(src: Path | None, format: str | None = None, split: str | None = None,
                     ann: Path | None = None, images: Path | None = None, store: str = "original",
                     names: list[str] | None = None, task: str = "detect") -> str:
    """A 32-hex-digit signature of the dataset `pack()` would read with the same arguments.

    `store` (the payload mode) and `task` (which labels a pack reads: detect, segment, pose, obb) are part of
    it, so a store packed another way, or for another task, is not mistaken for this one. Raises PackError (from the layout reader) when the source cannot be read.
    """
    source = open_source(src, format, split, ann, images, names)
    h = hashlib.sha256()
    h.update(f"{fmt.FORMAT_VERSION}\0{source.format}\0{source.split}\0{store}\0{task}\0{source.class_names}\n".encode())
    root = Path(source.root)
    for ann_file in source.annotation_files:
        h.update(f"ann {_stat(Path(ann_file), root)}\n".encode())
    for item in source.items:
        h.update(f"{item.name}\0{_stat(item.path, root)}\0{_stat(item.label_path, root)}\n".encode())
    return h.hexdigest()[:32]
