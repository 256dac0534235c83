"""What the packer found wrong with the source, counted and kept with file names.

Every problem has a reason code. `ERRORS` lose data (an image skipped, a label or box dropped):
they go to `rejects.jsonl` and stop a pack run with `--on-error fail`. `NOTES` are repairs or facts
(a clipped box, a background image, a converted grayscale JPEG) and are only counted.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

# reason -> what it means, for the summary a user reads.
ERRORS = {
    "missing_image": "image listed but its file is missing (image skipped)",
    "unreadable_image": "image file could not be read (image skipped)",
    "corrupt_image": "image truncated or corrupt, or not an image (image skipped)",
    "size_mismatch": "image size disagrees with the annotation (image skipped)",
    "unsupported_format": "image in a format nothing installed decodes (image skipped; the detail says what to install)",
    "image_too_large": "image over --max-pixels from its header, or too large to decode in memory (image skipped)",
    "check_failed": "unexpected error while checking the image (image skipped; the detail names it: please report it)",
    "duplicate_image_id": "COCO image id given to several images: their annotations cannot be told apart (all skipped)",
    "duplicate_file_name": "one file listed by several COCO image entries: its boxes are split between them (all skipped)",
    "label_without_image": "label file with no image (labels ignored)",
    "ambiguous_label": "two images that take one label file (a.jpg and a.png, a.jpg and a.JPG): both skipped, "
                       "the detail names them",
    "unreadable_label": "label file that cannot be read, e.g. not UTF-8 (image skipped, not packed without its boxes)",
    "orphan_annotation": "annotation for an image id not in the JSON (dropped)",
    "malformed_annotation": "malformed JSON annotation or image entry (dropped)",
    "malformed_line": "label line that is not numbers or has another count of values (image skipped, as Ultralytics "
                      "skips it: its objects are unknown, so it is not packed as background)",
    "unknown_class": "label line whose class id is beyond data.yaml's names, or 10000 or more without names (image "
                     "skipped, as Ultralytics skips it: not packed as background)",
    "unknown_category": "COCO annotation with a category_id not in the categories (dropped)",
    "box_degenerate": "box with zero or negative width/height (dropped)",
    "box_outside": "box entirely outside the image (dropped)",
    "box_far_outside": "box reaching far outside the image (a corner more than half the image beyond an edge): "
                       "coordinates of another unit or frame, e.g. pixels in a YOLO label (dropped, not clipped)",
    "points_far_outside": "polygon, keypoint or oriented-box point more than half the image beyond an edge: another "
                          "unit or frame (object dropped, not clipped)",
    "polygon_degenerate": "segment polygon of under 3 points or no area (object dropped)",
    "obb_degenerate": "oriented box whose four corners enclose no area (object dropped)",
    "keypoint_count": "COCO object whose keypoint count is not the category's (object dropped; the detail says the "
                      "count expected)",
    "rle_not_decoded": "non-crowd COCO object given as compressed RLE, and pycocotools is not installed to decode it "
                       "(object dropped: pip install pycocotools)",
}
NOTES = {
    "background": "image without boxes (kept as background)",
    "box_clipped": "box partly outside the image (clipped to it)",
    "crowd": "iscrowd box (kept for evaluation, excluded from training boxes)",
    "duplicate_box": "identical box repeated in one label file (duplicate dropped)",
    "polygon_to_box": "segment polygon label in a detect pack (converted to its bounding box, as Ultralytics does; "
                      "--task segment keeps the polygon)",
    "box_without_polygon": "box with no polygon in a segment pack: a box line, or a COCO object without segmentation "
                           "(box kept, no polygon)",
    "box_without_keypoints": "COCO object without keypoints in a pose pack (box kept, every keypoint unlabelled)",
    "keypoints_dropped": "pose line in a detect pack (its box kept, as Ultralytics does; --task pose keeps them)",
    "box_to_obb": "box line in an OBB pack (kept as its four corners)",
    "points_clipped": "polygon or oriented-box points partly outside the image (clipped to it)",
    "keypoint_hidden": "labelled keypoint outside the image (made unlabelled: visibility 0)",
    "polygon_parts_joined": "COCO object drawn in several polygons (joined into one ring, covering the same area)",
    "rle_to_polygon": "non-crowd COCO object given as an RLE mask (its outline traced into a polygon)",
    "no_flip_idx": "pose set without flip_idx in data.yaml: a left-right flip cannot swap its keypoints (Ultralytics "
                   "then turns fliplr and flipud off)",
    "bbox_as_text": "COCO bbox written as numeric strings (read as the numbers, as Ultralytics reads them)",
    "converted_grayscale": "grayscale image (decoded to RGB)",
    "converted_cmyk": "CMYK JPEG (decoded to RGB through OpenCV)",
    "converted_rgba": "image with alpha (alpha dropped, decoded to RGB)",
    "converted_format": "not a JPEG (PNG/BMP/WebP/...; decoded through OpenCV)",
    "converted_16bit": "16-bit image (scaled to 8 bits)",
    "oriented": "image with an EXIF orientation (turned upright; its boxes are taken in that frame: the detail says "
                "when --exif ignore is right)",
    "orientation_ignored": "image with an EXIF orientation left unapplied (--exif ignore: boxes in the stored frame)",
    "transcoded": "format a record cannot hold as is (HEIC, AVIF, GIF, PFM, DNG...): decoded at pack time, stored as PNG",
    "repeated_folder": "folder reached again through a link (a loop or a second link): its files are listed once",
    "unlisted_image": "image file not referenced by the annotations (not packed)",
}
IMAGE_REJECTS = {"missing_image", "unreadable_image", "corrupt_image", "size_mismatch", "unsupported_format",
                 "image_too_large", "check_failed", "duplicate_image_id", "duplicate_file_name", "unreadable_label",
                 "ambiguous_label", "malformed_line", "unknown_class"}
EXAMPLES_KEPT = 20


def utf8_name(name: str) -> str:
    """A file name as text UTF-8 can hold (records, the manifest, rejects.jsonl): a name's bytes that are not UTF-8 (a
    zip made on another system; Python reads them as lone surrogates) written as \\xNN; other names unchanged."""
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:   # a lone surrogate that is not an undecodable byte (a JSON "\\udXXX")
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class Problem:
    reason: str
    file: str
    detail: str = ""

    def __post_init__(self):
        assert self.reason in ERRORS or self.reason in NOTES, self.reason
        object.__setattr__(self, "file", utf8_name(self.file))

    @property
    def is_error(self) -> bool:
        return self.reason in ERRORS

    def describe(self) -> str:
        return f"{self.file}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


class PackReport:
    """Counts of every reason, a few examples of each, and the full list of errors."""

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.errors: list[Problem] = []

    def add(self, problem: Problem) -> None:
        self.counts[problem.reason] += 1
        ex = self.examples.setdefault(problem.reason, [])
        if len(ex) < EXAMPLES_KEPT:
            ex.append(problem.describe())
        if problem.is_error:
            self.errors.append(problem)

    def extend(self, problems) -> None:
        for p in problems:
            self.add(p)

    @property
    def images_rejected(self) -> int:
        return sum(self.counts[r] for r in IMAGE_REJECTS)

    def write_rejects(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for p in self.errors:
                kind = "image" if p.reason in IMAGE_REJECTS else "label"
                f.write(json.dumps({"file": p.file, "kind": kind, "reason": p.reason, "detail": p.detail}) + "\n")

    def to_dict(self) -> dict:
        return {"errors": {r: self.counts[r] for r in ERRORS if self.counts[r]},
                "notes": {r: self.counts[r] for r in NOTES if self.counts[r]},
                "examples": {r: self.examples[r] for r in sorted(self.examples)}}

    def summary_lines(self) -> list[str]:
        """Human-readable lines: one per reason seen, with its meaning and first example."""
        return [f"{tag:5} {n:6d}  {reason}: {meaning}; e.g. {self.examples[reason][0]}"
                for table, tag in ((ERRORS, "error"), (NOTES, "note")) for reason, meaning in table.items()
                if (n := self.counts[reason])]
