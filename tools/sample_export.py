"""Write the bundled 16-image sample as a YOLO dataset laid out the way people download one, to try
`fastfeed pack` and FastfeedTrainer on it (docs/first_hour.md):

    python tools/sample_export.py OUT                          # Roboflow's export: train/ valid/ + data.yaml
    python tools/sample_export.py OUT --layout ultralytics     # images/train2017 + labels/train2017 + data.yaml

roboflow:    OUT/train/images, OUT/train/labels, OUT/valid/images, OUT/valid/labels (every 4th image), and
             OUT/data.yaml with `train: ../train/images`, `val: ../valid/images`, nc and names, as Roboflow writes it
ultralytics: OUT/images/train2017 + OUT/labels/train2017, data.yaml with `path: OUT`, train and val both that split

The labels are the sample's COCO boxes (crowd regions left out, as Ultralytics' convert_coco does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

LAYOUTS = ("roboflow", "ultralytics")


def yolo_line(cls: int, xyxy) -> str:
    """One YOLO label line from a box in normalised x1, y1, x2, y2."""
    x1, y1, x2, y2 = (float(v) for v in xyxy)
    return f"{cls} {(x1 + x2) / 2:.6f} {(y1 + y2) / 2:.6f} {x2 - x1:.6f} {y2 - y1:.6f}"


def write_data_yaml(file: Path, names: list[str], **entries: str) -> Path:
    """data.yaml with `entries` (path, train, val), nc and the names as a list (as Roboflow writes them)."""
    file.write_text("".join(f"{k}: {v}\n" for k, v in entries.items())
                    + f"nc: {len(names)}\nnames: {json.dumps(list(names))}\n")
    return file


def export(out: Path, layout: str = "roboflow", src: Path | None = None) -> Path:
    """Write the dataset into `out` (created; must not exist) and return its data.yaml."""
    import fastfeed
    from fastfeed import Store
    from fastfeed.pack import PackConfig, pack

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    src = Path(src or fastfeed.sample_path())
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        pack(PackConfig(src=src, out=Path(tmp) / "s.ff", progress=False, workers=1))
        store = Store(Path(tmp) / "s.ff")
        images_dir = Path(store.manifest.source["root"]) / "images" / (store.manifest.source["split"] or "")
        for i in range(len(store)):
            s = store.get(i, decode=False)
            split = ("valid" if i % 4 == 3 else "train") if layout == "roboflow" else "train2017"
            images, labels = ((out / split / "images", out / split / "labels") if layout == "roboflow"
                              else (out / "images" / split, out / "labels" / split))
            images.mkdir(parents=True, exist_ok=True)
            labels.mkdir(parents=True, exist_ok=True)
            shutil.copy(images_dir / s.file_name, images / s.file_name)
            (labels / (Path(s.file_name).stem + ".txt")).write_text(
                "".join(yolo_line(c, b) + "\n" for b, c in zip(s.boxes, s.classes)))
        names = store.class_names
        store.close()
    if layout == "roboflow":
        return write_data_yaml(out / "data.yaml", names, train="../train/images", val="../valid/images")
    return write_data_yaml(out / "data.yaml", names, path=str(out.resolve()), train="images/train2017",
                           val="images/train2017")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder to create")
    ap.add_argument("--layout", choices=LAYOUTS, default="roboflow", help="default: roboflow")
    args = ap.parse_args(argv)
    if args.out.exists():
        ap.error(f"{args.out} already exists")
    data = export(args.out, args.layout)
    print(f"wrote {args.out} ({args.layout} layout): {data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
