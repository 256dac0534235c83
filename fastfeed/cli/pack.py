"""`fastfeed pack`."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import sample_path, tasks
from .common import EXIT_OK, EXIT_USAGE, add_remote_args, config_of, defaults, fail, store_options, store_path

HELP = "pack a COCO or YOLO dataset into a checked LMDB store"

def add_parser(sub) -> None:
    from ..pack import EXIF_MODES, STORE_MODES, PackConfig
    from ..pack.usable import COCO_BOX_UNITS

    d = defaults(PackConfig)
    p = sub.add_parser(
        "pack", help=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pack a COCO or YOLO dataset into LMDB shards + manifest.json. Every image is decoded\n"
                    "and every box checked; problems are counted, reported by file name, and skipped images\n"
                    "listed in OUT/rejects.jsonl. The store is written beside OUT and renamed into place only\n"
                    "when complete. The source is never modified. Every image format Ultralytics reads is packed;\n"
                    "those DALI cannot decode (AVIF, HEIC, DNG, PFM) are stored as PNG. See docs/inputs.md.",
        epilog="layouts (auto-detected):\n"
               "  COCO   SRC/annotations/instances_<split>.json + SRC/images/<split>/\n"
               "         SRC/annotations.json (any one *.json) + SRC/images/, or --ann FILE.json --images DIR\n"
               "  YOLO   SRC/images/<split>/ + SRC/labels/<split>/*.txt (+ SRC/data.yaml names),\n"
               "         or SRC/images/ + SRC/labels/\n"
               "  split  SRC/<split>/images/ + SRC/<split>/labels/ + SRC/data.yaml (Roboflow's YOLO export;\n"
               "  folders  --split valid or --split val), SRC/<split>/<file>.json + images (its COCO export)\n"
               "  data.yaml  the file Ultralytics trains from: its train:/val:/test: folders and names\n"
               "A pack in which no image (or under 1%) has a label, or keeps a box once every line is checked\n"
               "(empty label files, pixels where YOLO wants 0..1), stops and says what it found;\n"
               "--allow-background-only packs a set that is all background. A folder with both a COCO JSON and\n"
               "YOLO labels/ stops: choose with --format. A COCO set annotated on the raw pixels of EXIF-turned\n"
               "photos stops: --exif ignore. An image whose label file cannot be read (a malformed line, a class\n"
               "beyond data.yaml's names) is skipped, as Ultralytics skips it; one reason dropping over\n"
               "--max-dropped (10%) of the images or boxes stops the pack.\n"
               "examples:\n"
               "  fastfeed pack -o sample.ff                        # the bundled 16-image sample\n"
               "  fastfeed pack datasets/coco -o coco.ff --split val2017\n"
               "  fastfeed pack my_export/data.yaml -o train.ff      # Roboflow / Ultralytics (--split val)\n"
               "  fastfeed pack --ann export/annotations.json --images export/images -o x.ff\n"
               "  fastfeed pack datasets/yolo -o small.ff --store jpeg --max-side 640 --quality 90\n"
               "  fastfeed pack datasets/coco -o s3://bucket/coco.ff  # a store in object storage (any fsspec URL)\n"
               "  fastfeed pack s3://bucket/datasets/coco -o coco.ff  # a source in a bucket\n"
               "A store written to a URL appears only when complete: shards first (named after the pack, so\n"
               "--force never mixes two packs for a reader), the manifest last, then the old shards removed.")
    p.add_argument("src", nargs="?", type=store_path,
                   help="dataset folder (or its URL in a bucket), or an Ultralytics data.yaml (default: the sample "
                        "bundled with fastfeed)")
    p.add_argument("-o", "--out", type=store_path, required=True,
                   help="store folder to create, or a URL (s3://bucket/coco.ff, gs://..., az://...)")
    p.add_argument("--format", choices=("coco", "yolo"),
                   help="force the layout instead of detecting it (needed where SRC holds both a COCO JSON and YOLO "
                        "labels/); default: detected from SRC")
    p.add_argument("--task", choices=("detect", "segment", "pose", "obb"),
                   help="what each record holds besides boxes: detect (boxes only), segment (YOLO-seg polygons, COCO "
                        "segmentation), pose (keypoints: data.yaml's kpt_shape and flip_idx, or COCO keypoints), obb "
                        "(YOLO-OBB corners); default: pose when data.yaml gives kpt_shape, else detect")
    p.add_argument("--split", help="split to pack: a folder name, or data.yaml's key (train, val, test); default: "
                                   "the only one, else train2017/train")
    p.add_argument("--ann", type=Path, help="COCO JSON file (with --images, instead of SRC)")
    p.add_argument("--images", type=Path, help="images folder for --ann")
    p.add_argument("--store", choices=STORE_MODES, default=d["store"],
                   help=f"payload: source bytes (original), re-encoded JPEG, or decoded pixels (raw: no decode at "
                        f"read time); default {d['store']}")
    p.add_argument("--max-side", type=int,
                   help="jpeg/raw: shrink so the long side is at most this (boxes follow); default: none, the source's "
                        "size")
    p.add_argument("--quality", type=int, default=d["quality"], help=f"jpeg: JPEG quality 1-100 (default {d['quality']})")
    p.add_argument("--exif", choices=EXIF_MODES, default=d["exif"],
                   help="apply: take every image upright by its EXIF orientation, as labelling tools and Ultralytics "
                        "show it, and its boxes in that frame (the default); ignore: boxes drawn on the raw stored "
                        "pixels (some COCO exports). Counted in the report either way")
    p.add_argument("--coco-boxes", choices=COCO_BOX_UNITS, default=d["coco_boxes"],
                   help="units of COCO bboxes: pixels, as the format says (default), or normalized: fractions of "
                        "the image's width and height, as some exports write them (a set whose every bbox fits in "
                        "0..1 stops and names this option)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--shards", type=int, help="number of shards (default: by size, see --shard-mb)")
    g.add_argument("--shard-mb", type=float,
                   help="cut shards of about this many MB of records, however few that makes (default: 1024 for a "
                        "folder, 128 for a URL, and at least 4 shards per pack worker so that every core has work, "
                        "none under 64 images)")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores; 0 or 1 packs in-process)")
    p.add_argument("--on-error", choices=("skip", "fail"), default=d["on_error"],
                   help="skip bad images/labels and report them (default), or stop at the first")
    p.add_argument("--check", choices=("entropy", "full"), default=d["check"],
                   help="how --store original proves JPEGs intact: a strict decode at 1/8 scale, which fails "
                        "on the same truncated/corrupt files as a full decode at about half the cost "
                        "(default), or a full-size decode")
    p.add_argument("--max-pixels", type=int, metavar="N",
                   help="refuse images of more than N pixels, read from the header before anything is decoded "
                        f"(image_too_large; default {d['max_pixels']:,}, Pillow's decompression-bomb limit); raise it for "
                        "genuinely huge images")
    p.add_argument("--allow-background-only", action="store_true",
                   help="pack even when no image (or under 1%%) has a label or keeps a box: a set that really is all "
                        "background")
    p.add_argument("--max-dropped", type=float, default=d["max_dropped"], metavar="SHARE",
                   help="stop when one reason drops over this share of the split's images, or of its boxes (a class "
                        f"beyond data.yaml's names, boxes in pixels...); default {d['max_dropped']:g}: 10%%")
    p.add_argument("--force", action="store_true", help="replace OUT if it is an existing store")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_remote_args(p)
    p.set_defaults(func=run)


def _print_report(report, rejects) -> None:
    if lines := report.summary_lines():
        listed = f"; errors are listed in {rejects}" if isinstance(rejects, str) or (
            rejects is not None and rejects.is_file()) else ""
        print(f"problems found (all counted{listed}):")
        for line in lines:
            print("  " + line)


def run(args) -> int:
    from ..pack import PackConfig, PackError, pack
    from ..store.objstore import RemoteError
    from ..store.verify import task_summary

    src, ann = args.src, args.ann
    if src is None and ann is None:
        src = sample_path()
        print(f"no SRC given: packing the bundled sample ({src})")
    try:
        cfg = config_of(PackConfig, args, src=src, overwrite=args.force, progress=not args.quiet,
                        storage_options=store_options(args).storage_options)
        res = pack(cfg)
    except (RemoteError, ImportError) as e:
        return fail(str(e))
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    except PackError as e:
        if e.report is not None:
            _print_report(e.report, e.rejects)
        return fail(str(e))
    m = res.manifest
    print(f"packed {res.source_desc}")
    n, b = m.num_images, m.num_boxes
    print(f"  -> {res.out}: {n} image{'s' * (n != 1)}, {b} box{'es' * (b != 1)} ({m.num_crowd} crowd), "
          f"{len(m.shards)} shard(s), {m.stats['record_bytes'] / 2**20:.1f} MB, "
          f"{res.seconds:.1f} s ({m.num_images / max(res.seconds, 1e-9):.0f} images/s)")
    if (line := tasks.get(m.task).describe(task_summary(m))) is not None:
        print(f"  {line}")
    if rejected := res.report.images_rejected:
        print(f"  {rejected} image(s) skipped: see {res.rejects}")
    _print_report(res.report, res.rejects)
    return EXIT_OK
