"""A real public segmentation set for `ultralytics_ab.py --task segment --data PATH/data.yaml` (issue 34).

    python benchmarks/fetch_realseg.py MIRROR_GIT_DIR [--dst /work/data/realseg] [--train 400] [--val 96]

Source: a Roboflow YOLOv8 instance-segmentation export with its images in the repository
github.com/aysebingol/yolov8-shoe-sole-segmentation at commit 1345aab0c74058be680fc825665ca0c314550079
(later commits delete the images). Roboflow project "new_dataset" v7 "All_Last" by workspace hasan-vimtf,
https://universe.roboflow.com/hasan-vimtf/new_dataset-hzjpg/dataset/7, licence CC BY 4.0 (its data.yaml and
README.dataset.txt), exported 2026-01-15: one class (`shoes`), polygons, 1935 train / 15 valid / 7 test photos
of shoe soles (auto-oriented, not resized), taken one every few seconds over one day.

MIRROR_GIT_DIR is a clone (bare or not) of that repository holding the commit. The export's valid and test
folders are 22 images, too few for a stable mAP, so the split is re-made from the export's train photos by time:
train takes `--train` photos spread evenly over the first 75% of the day, val `--val` over the last 25% plus the
export's valid and test (adjacent photos show the same sole, so a split by time keeps them on one side). The
photos and labels are copied unchanged; the data.yaml written names the one class and the source.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

COMMIT = "1345aab0c74058be680fc825665ca0c314550079"
SOURCE = "github.com/aysebingol/yolov8-shoe-sole-segmentation"


def _spread(items: list[str], n: int) -> list[str]:
    """`n` of `items` evenly spaced (all of them when n >= len)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def fetch(git_dir: Path, dst: Path, n_train: int, n_val: int) -> Path:
    if subprocess.run(["git", "-C", str(git_dir), "cat-file", "-e", f"{COMMIT}^{{commit}}"]).returncode:
        sys.exit(f"{git_dir} does not hold commit {COMMIT} of {SOURCE}: clone that repository (with history) and "
                 "pass its git directory")
    archive = subprocess.run(["git", "-C", str(git_dir), "archive", "--format=tar", COMMIT, "train", "valid", "test",
                              "data.yaml", "README.dataset.txt", "README.roboflow.txt"], capture_output=True, check=True)
    export = dst / "export"
    shutil.rmtree(dst, ignore_errors=True)
    export.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(export, filter="data")
    return split_by_time(export, dst, n_train, n_val)


def split_by_time(export: Path, dst: Path, n_train: int, n_val: int) -> Path:
    """Copy `export`'s photos and labels into dst/train and dst/val (see the module's docstring); the data.yaml."""
    photos = sorted(p.name for p in (export / "train" / "images").glob("*.jpg"))  # names carry the time taken
    cut = len(photos) * 3 // 4
    split = {"train": [("train", p) for p in _spread(photos[:cut], n_train)],
             "val": [("train", p) for p in _spread(photos[cut:], n_val)]
                    + [(s, p.name) for s in ("valid", "test") for p in sorted((export / s / "images").glob("*.jpg"))]}
    for name, members in split.items():
        for sub in ("images", "labels"):
            (dst / name / sub).mkdir(parents=True)
        for folder, photo in members:
            shutil.copy2(export / folder / "images" / photo, dst / name / "images" / photo)
            shutil.copy2(export / folder / "labels" / (Path(photo).stem + ".txt"), dst / name / "labels")
    (dst / "data.yaml").write_text(
        f"# {SOURCE} @ {COMMIT}: Roboflow new_dataset v7 (hasan-vimtf), CC BY 4.0; made by benchmarks/fetch_realseg.py"
        f" --train {n_train} --val {n_val}\npath: {dst}\ntrain: train/images\nval: val/images\nnames:\n  0: shoes\n")
    print(f"{dst / 'data.yaml'}: {len(split['train'])} train, {len(split['val'])} val images")
    return dst / "data.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("git_dir", type=Path)
    ap.add_argument("--dst", type=Path, default=Path("/work/data/realseg"))
    ap.add_argument("--train", type=int, default=400, help="train photos (of the first 75%% of the day)")
    ap.add_argument("--val", type=int, default=96, help="val photos (of the last 25%%), besides the export's 22")
    args = ap.parse_args()
    fetch(args.git_dir, args.dst.resolve(), args.train, args.val)
    return 0


if __name__ == "__main__":
    sys.exit(main())
