"""Datasets per Ultralytics task from coco128's real photos (issue 28), YOLO layout + data.yaml each.

    python benchmarks/task_sets.py --task segment|pose|obb|detect|shapes-seg|shapes-pose|shapes-obb --out DIR

- `segment`: coco128's own polygons (COCO `segmentation`, crowd regions left out as for boxes) as YOLO-seg
  lines. An object drawn in several parts (82 of coco128's 929) becomes one outline: each further part is
  joined to the outline so far at their closest vertices by a zero-width bridge, so the filled area is
  the union of the parts.
- `obb`: DERIVED: each of those outlines' `cv2.minAreaRect` as four corners (YOLO-OBB lines), corners
  clipped to the image (Ultralytics drops a whole image whose label has a coordinate above 1).
- `pose`: DERIVED, coco128 holds no keypoints: the images with persons only, each non-crowd person with 17
  keypoints in COCO's order (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles) placed on a
  fixed upright-body template in the person's box and each moved to the nearest vertex of the person's
  outline when it falls off the person, so every point lies on the person; visibility 2, kpt_shape
  [17, 3], flip_idx COCO's.
- `detect`: the same images with their boxes (the reference every other task is compared with).
- `shapes-seg`: a set a from-scratch yolov8n-seg learns on a CPU in minutes: coco128 photos as
  backgrounds with 1-4 non-overlapping squares, discs (32-gons) and triangles painted with exactly the
  polygons of their labels; train and val on different photos.
- `shapes-pose`: the same kind of set for a from-scratch yolov8n-pose: 1-4 non-overlapping isosceles triangles
  turned by up to +-30 degrees, one class, their corners as 3 keypoints (apex, the image's left base, right
  base; visibility 2), kpt_shape [3, 3], flip_idx [0, 2, 1] (a mirror swaps the base corners).
- `shapes-obb`: 1-4 non-overlapping rectangles (aspect 1.4-2.2) and bars (3.5-5) turned by any angle, their
  YOLO-OBB lines exactly the painted corners.
`--images N` cycles the source images to N real files (`common.replicate_coco`); data.yaml has train = val.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, replicate_coco, write_painted_set  # noqa: E402

TASKS = ("detect", "segment", "pose", "obb")
SPLIT = "train2017"
KPT_NAMES = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
             "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
             "right_knee", "left_ankle", "right_ankle")
FLIP_IDX = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]
# (u, v) in the person's box, a person facing the camera: their left is the image's right.
_TEMPLATE = np.float32([(.50, .07), (.54, .05), (.46, .05), (.58, .07), (.42, .07), (.70, .20), (.30, .20),
                        (.80, .35), (.20, .35), (.85, .50), (.15, .50), (.62, .55), (.38, .55), (.60, .75),
                        (.40, .75), (.60, .95), (.40, .95)])
SHAPES = ("square", "disc", "triangle")


def outline(parts: list[list[float]]) -> np.ndarray:
    """A COCO object's polygon parts (flat pixel lists) as one float32 [P,2] outline (see the module doc)."""
    polys = [np.float32(p).reshape(-1, 2) for p in parts if len(p) >= 6]
    out = polys[0]
    for p in polys[1:]:
        d = ((out[:, None] - p[None]) ** 2).sum(-1)
        i, j = np.unravel_index(int(d.argmin()), d.shape)
        p = np.roll(p, -j, axis=0)
        out = np.concatenate([out[:i + 1], p, p[:1], out[i:]])
    return out


def keypoints_of(poly: np.ndarray, bbox) -> np.ndarray:
    """17 template keypoints in the box `bbox` (x, y, w, h pixels), each kept if inside `poly` else moved to
    its nearest vertex: float32 [17, 2] pixels."""
    x, y, w, h = bbox
    pts = _TEMPLATE * np.float32([w, h]) + np.float32([x, y])
    contour = poly.reshape(-1, 1, 2)
    for k, p in enumerate(pts):
        if cv2.pointPolygonTest(contour, (float(p[0]), float(p[1])), False) < 0:
            pts[k] = poly[((poly - p) ** 2).sum(1).argmin()]
    return pts


def _fmt(values) -> str:
    return " ".join(f"{v:.6f}" for v in values)


def label_lines(task: str, anns: list[dict], width: int, height: int, cats: dict[int, int]) -> list[str]:
    """The YOLO lines of one image's COCO annotations for `task` (crowd regions left out)."""
    scale = np.float32([width, height])
    lines = []
    for a in anns:
        if a.get("iscrowd"):
            continue
        x, y, w, h = a["bbox"]
        box = _fmt([(x + w / 2) / width, (y + h / 2) / height, w / width, h / height])
        if task == "detect":
            lines.append(f"{cats[a['category_id']]} {box}")
            continue
        poly = outline(a["segmentation"])
        if task == "segment":
            lines.append(f"{cats[a['category_id']]} {_fmt(np.clip(poly / scale, 0, 1).ravel())}")
        elif task == "obb":
            corners = cv2.boxPoints(cv2.minAreaRect(poly))
            lines.append(f"{cats[a['category_id']]} {_fmt(np.clip(corners / scale, 0, 1).ravel())}")
        elif a["category_id"] == 1:   # pose: persons only, one class
            kpts = np.clip(keypoints_of(poly, a["bbox"]) / scale, 0, 1)
            lines.append("0 " + box + " " + " ".join(f"{u:.6f} {v:.6f} 2" for u, v in kpts))
    return lines


def _person_source(src: Path, tmp: Path) -> Path:
    """A COCO source holding only the images of `src` with a non-crowd person (images linked, not copied)."""
    ann = json.loads((src / "annotations" / f"instances_{SPLIT}.json").read_text())
    keep = {a["image_id"] for a in ann["annotations"] if a["category_id"] == 1 and not a.get("iscrowd")}
    (tmp / "images" / SPLIT).mkdir(parents=True)
    (tmp / "annotations").mkdir()
    images = [im for im in ann["images"] if im["id"] in keep]
    for im in images:
        (tmp / "images" / SPLIT / im["file_name"]).symlink_to(src / "images" / SPLIT / im["file_name"])
    anns = [a for a in ann["annotations"] if a["image_id"] in keep]
    (tmp / "annotations" / f"instances_{SPLIT}.json").write_text(json.dumps(ann | {"images": images,
                                                                                    "annotations": anns}))
    return tmp


def make_task_set(task: str, dst: Path, src: Path | None = None, n_images: int | None = None) -> Path:
    """`task`'s set at `dst` (replaced) from the COCO source (default coco128); returns its data.yaml."""
    if task not in TASKS:
        raise ValueError(f"task {task!r}: expected one of {', '.join(TASKS)}")
    src = Path(src or default_source())
    with tempfile.TemporaryDirectory(prefix="ff-taskset-") as tmp:
        if task == "pose":
            src = _person_source(src, Path(tmp))
        if n_images is None:
            n_images = len(json.loads((src / "annotations" / f"instances_{SPLIT}.json").read_text())["images"])
        replicate_coco(src, dst, n_images)
    ann = json.loads((dst / "annotations" / f"instances_{SPLIT}.json").read_text())
    cats = {c["id"]: k for k, c in enumerate(sorted(ann["categories"], key=lambda c: c["id"]))}
    by_image: dict[int, list] = {}
    for a in ann["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    for im in ann["images"]:
        lines = label_lines(task, by_image.get(im["id"], []), im["width"], im["height"], cats)
        (dst / "labels" / SPLIT / (Path(im["file_name"]).stem + ".txt")).write_text("".join(f"{ln}\n" for ln in lines))
    shutil.rmtree(dst / "annotations")            # one layout: the YOLO one both sides read
    if task == "pose":
        extra = f"kpt_shape: [17, 3]\nflip_idx: {FLIP_IDX}\nnames:\n  0: person\n"
    else:
        extra = "names:\n" + "".join(f"  {k}: {c['name']}\n"
                                     for k, c in enumerate(sorted(ann["categories"], key=lambda c: c["id"])))
    (dst / "data.yaml").write_text(f"path: {dst}\ntrain: images/{SPLIT}\nval: images/{SPLIT}\n{extra}")
    return dst / "data.yaml"


# --- shapes-seg ----------------------------------------------------------------------------------

def shape_polygon(cls: int, x1: int, y1: int, side: int) -> np.ndarray:
    if cls == 0:
        return np.float32([[x1, y1], [x1 + side, y1], [x1 + side, y1 + side], [x1, y1 + side]])
    if cls == 1:
        t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        r = side / 2
        return np.stack([x1 + r + r * np.cos(t), y1 + r + r * np.sin(t)], 1).astype(np.float32)
    return np.float32([[x1 + side / 2, y1], [x1 + side, y1 + side], [x1, y1 + side]])


def placements(h: int, w: int, rng, lo: float = 0.12, hi: float = 0.4):
    """1-4 non-overlapping squares (x1, y1, side) in an h x w image, side a `lo`-`hi` share of the short side
    (a square given up after 20 tries). A generator: what the caller draws from `rng` between two squares keeps
    its place in the stream."""
    taken = []
    for _ in range(int(rng.integers(1, 5))):
        for _attempt in range(20):
            side = int(rng.uniform(lo, hi) * min(h, w))
            x1, y1 = int(rng.integers(0, w - side)), int(rng.integers(0, h - side))
            if all(x1 + side < a or a + s < x1 or y1 + side < b or b + s < y1 for a, b, s in taken):
                break
        else:
            continue
        taken.append((x1, y1, side))
        yield x1, y1, side


def _fill(img: np.ndarray, poly: np.ndarray, rng) -> None:
    colour = tuple(int(c) for c in rng.integers(0, 256, 3))
    cv2.fillPoly(img, [np.round(poly).astype(np.int32)], colour, lineType=cv2.LINE_AA)


def paint_shapes(img: np.ndarray, rng) -> list[str]:
    """Paint 1-4 non-overlapping shapes on `img` (BGR, in place); their YOLO-seg lines (the painted polygons)."""
    h, w = img.shape[:2]
    lines = []
    for x1, y1, side in placements(h, w, rng):
        cls = int(rng.integers(len(SHAPES)))
        poly = shape_polygon(cls, x1, y1, side)
        _fill(img, poly, rng)
        lines.append(f"{cls} {_fmt((poly / np.float32([w, h])).clip(0, 1).ravel())}")
    return lines


def _backgrounds(src: Path | None) -> list[Path]:
    """The source's photos the painted sets paint on (coco128's by default)."""
    return sorted((Path(src or default_source()) / "images" / SPLIT).glob("*.jpg"))


def make_shapes_seg(dst: Path, src: Path | None = None, n_train: int = 192, n_val: int = 64, seed: int = 0) -> Path:
    """Shapes with exact polygons on the source's photos (320 px long side), train/val on different photos."""
    backgrounds = _backgrounds(src)
    return write_painted_set(dst, backgrounds, paint_shapes, list(SHAPES), n_train, n_val, seed)


# --- shapes-pose, shapes-obb ---------------------------------------------------------------------

POSE_KPTS = ("apex", "left_base", "right_base")   # left/right as the image shows them
POSE_FLIP_IDX = [0, 2, 1]                          # a mirrored image's left base is the original's right one
OBB_SHAPES = ("rectangle", "bar")
_OBB_ASPECT = ((1.4, 2.2), (3.5, 5.0))             # long side over short side per OBB class
_SIZES = (0.18, 0.45)                              # bigger than shapes-seg's: keypoints and thin bars at imgsz 128


def pose_triangle(x1: float, y1: float, side: float, angle: float) -> np.ndarray:
    """An isosceles triangle inscribed in the circle of the square (x1, y1, side), apex up when `angle` (degrees,
    clockwise on screen) is 0: float32 [3, 2] pixels in POSE_KPTS' order. The base corners sit at 135 and 45
    degrees from the apex's 270 (y down), so for |angle| < 45 the left base has the smaller x."""
    r = side / 2
    t = np.radians(np.float32([270, 135, 45]) + angle)
    return np.stack([x1 + r + r * np.cos(t), y1 + r + r * np.sin(t)], 1).astype(np.float32)


def obb_corners(x1: float, y1: float, side: float, aspect: float, angle: float) -> np.ndarray:
    """A rectangle of `aspect` whose diagonal is `side`, centred in the square (x1, y1, side) and turned by
    `angle` degrees: its four corners, float32 [4, 2] pixels (cv2.boxPoints' order)."""
    long_side = side / np.sqrt(1 + aspect ** -2)
    return cv2.boxPoints(((x1 + side / 2, y1 + side / 2), (long_side, long_side / aspect), angle)).astype(np.float32)


def paint_pose(img: np.ndarray, rng) -> list[str]:
    """Paint 1-4 non-overlapping triangles turned by up to +-30 degrees; their YOLO-pose lines (box of the
    corners, the three corners as keypoints, visibility 2)."""
    h, w = img.shape[:2]
    lines = []
    for x1, y1, side in placements(h, w, rng, *_SIZES):
        tri = pose_triangle(x1, y1, side, rng.uniform(-30, 30))
        _fill(img, tri, rng)
        (lx, ly), (hx, hy) = tri.min(0), tri.max(0)
        box = [(lx + hx) / 2 / w, (ly + hy) / 2 / h, (hx - lx) / w, (hy - ly) / h]
        lines.append("0 " + _fmt(box) + "".join(f" {u:.6f} {v:.6f} 2" for u, v in tri / np.float32([w, h])))
    return lines


def paint_obb(img: np.ndarray, rng) -> list[str]:
    """Paint 1-4 non-overlapping rectangles and bars at any angle; their YOLO-OBB lines (the painted corners)."""
    h, w = img.shape[:2]
    lines = []
    for x1, y1, side in placements(h, w, rng, *_SIZES):
        cls = int(rng.integers(len(OBB_SHAPES)))
        corners = obb_corners(x1, y1, side, rng.uniform(*_OBB_ASPECT[cls]), rng.uniform(0, 180))
        _fill(img, corners, rng)
        lines.append(f"{cls} {_fmt((corners / np.float32([w, h])).clip(0, 1).ravel())}")
    return lines


def make_shapes_pose(dst: Path, src: Path | None = None, n_train: int = 192, n_val: int = 64, seed: int = 0) -> Path:
    """Triangles with their corners as 3 keypoints (see paint_pose) on the source's photos; data.yaml with
    kpt_shape [3, 3] and flip_idx POSE_FLIP_IDX."""
    backgrounds = _backgrounds(src)
    data = write_painted_set(dst, backgrounds, paint_pose, ["triangle"], n_train, n_val, seed)
    data.write_text(data.read_text() + f"kpt_shape: [{len(POSE_KPTS)}, 3]\nflip_idx: {POSE_FLIP_IDX}\n")
    return data


def make_shapes_obb(dst: Path, src: Path | None = None, n_train: int = 192, n_val: int = 64, seed: int = 0) -> Path:
    """Rectangles and bars at random angles with exactly their corners as YOLO-OBB labels, on the source's photos."""
    backgrounds = _backgrounds(src)
    return write_painted_set(dst, backgrounds, paint_obb, list(OBB_SHAPES), n_train, n_val, seed)


PAINTED = {"shapes-seg": make_shapes_seg, "shapes-pose": make_shapes_pose, "shapes-obb": make_shapes_obb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, choices=(*TASKS, *PAINTED))
    ap.add_argument("--out", type=Path, required=True, help="folder to write (replaced)")
    ap.add_argument("--images", type=int, help="cycle the source images to this many files (default: each once)")
    ap.add_argument("--src", type=Path, help="COCO source (default: coco128)")
    args = ap.parse_args()
    if args.task in PAINTED:
        data = PAINTED[args.task](args.out, args.src)
    else:
        data = make_task_set(args.task, args.out, args.src, args.images)
    labels = list((args.out / "labels").rglob("*.txt"))
    objects = sum(len(p.read_text().splitlines()) for p in labels)
    print(f"wrote {data}: {len(labels)} images, {objects} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
