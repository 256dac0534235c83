"""The `fastfeed` command line: argparse subcommands mapped onto configs. The only module that prints."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import __version__, sample_path

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# --- pack -----------------------------------------------------------------------------------------

def _add_pack(sub) -> None:
    p = sub.add_parser(
        "pack", help="pack a COCO or YOLO dataset into a checked LMDB store",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pack a COCO or YOLO dataset into LMDB shards + manifest.json. Every image is decoded\n"
                    "and every box checked; problems are counted, reported by file name, and skipped images\n"
                    "listed in OUT/rejects.jsonl. The store is written beside OUT and renamed into place only\n"
                    "when complete. The source is never modified.",
        epilog="layouts (auto-detected):\n"
               "  COCO  SRC/annotations/instances_<split>.json + SRC/images/<split>/\n"
               "  YOLO  SRC/images/<split>/ + SRC/labels/<split>/*.txt (+ SRC/data.yaml names),\n"
               "        or SRC/images/ + SRC/labels/\n"
               "examples:\n"
               "  fastfeed pack -o sample.ff                        # the bundled 16-image sample\n"
               "  fastfeed pack datasets/coco -o coco.ff --split val2017\n"
               "  fastfeed pack datasets/yolo -o small.ff --store jpeg --max-side 640 --quality 90")
    p.add_argument("src", nargs="?", type=Path,
                   help="dataset folder (default: the sample bundled with fastfeed)")
    p.add_argument("-o", "--out", type=Path, required=True, help="store folder to create")
    p.add_argument("--format", choices=("coco", "yolo"), help="force the layout instead of detecting it")
    p.add_argument("--split", help="split to pack (default: the only one, else train2017/train)")
    p.add_argument("--ann", type=Path, help="COCO JSON file (with --images, instead of SRC)")
    p.add_argument("--images", type=Path, help="images folder for --ann")
    p.add_argument("--store", choices=("original", "jpeg", "raw"), default="original",
                   help="payload: source bytes (default), re-encoded JPEG, or decoded pixels (no decode at read time)")
    p.add_argument("--max-side", type=int, help="jpeg/raw: shrink so the long side is at most this (boxes follow)")
    p.add_argument("--quality", type=int, default=90, help="jpeg: JPEG quality 1-100 (default 90)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--shards", type=int, help="number of shards (default: by size, see --shard-mb)")
    g.add_argument("--shard-mb", type=float, help="start a new shard past this many MB (default 1024)")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores; 0 or 1 packs in-process)")
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="skip bad images/labels and report them (default), or stop at the first")
    p.add_argument("--check", choices=("entropy", "full"), default="entropy",
                   help="how --store original proves JPEGs intact: a strict decode at 1/8 scale, which fails "
                        "on the same truncated/corrupt files as a full decode at about half the cost "
                        "(default), or a full-size decode")
    p.add_argument("--force", action="store_true", help="replace OUT if it is an existing store")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_pack)


def _print_report(report) -> None:
    lines = report.summary_lines()
    if lines:
        print("problems found (all counted; errors are listed in rejects.jsonl):")
        for line in lines:
            print("  " + line)


def cmd_pack(args) -> int:
    from .pack import PackConfig, PackError, pack

    src, ann = args.src, args.ann
    if src is None and ann is None:
        src = sample_path()
        print(f"no SRC given: packing the bundled sample ({src})")
    try:
        cfg = PackConfig(src=src, out=args.out, format=args.format, split=args.split, ann=ann,
                         images=args.images, store=args.store, max_side=args.max_side, quality=args.quality,
                         shards=args.shards, shard_mb=args.shard_mb, workers=args.workers,
                         on_error=args.on_error, check=args.check, overwrite=args.force, progress=not args.quiet)
        res = pack(cfg)
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    except PackError as e:
        if e.report is not None:
            _print_report(e.report)
        return _fail(str(e))
    m = res.manifest
    print(f"packed {res.source_desc}")
    print(f"  -> {res.out}: {m['num_images']} images, {m['num_boxes']} boxes ({m['num_crowd']} crowd), "
          f"{len(m['shards'])} shard(s), {m['stats']['record_bytes'] / 2**20:.1f} MB, "
          f"{res.seconds:.1f} s ({m['num_images'] / max(res.seconds, 1e-9):.0f} images/s)")
    rejected = res.report.images_rejected
    if rejected:
        print(f"  {rejected} image(s) skipped: see {res.out / 'rejects.jsonl'}")
    _print_report(res.report)
    return EXIT_OK


# --- inspect / verify -----------------------------------------------------------------------------

def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="summarise a store: counts, classes, image sizes, bytes")
    p.add_argument("store", type=Path)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args) -> int:
    from .store.format import FormatError
    from .store.verify import summarize

    try:
        s = summarize(args.store)
    except FormatError as e:
        return _fail(str(e))
    if args.json:
        print(json.dumps(s, indent=1))
        return EXIT_OK
    p = s["payload"]
    print(f"{s['path']}  (format v{s['format_version']}, created {s['created']}, fingerprint {s['fingerprint']})")
    print(f"  images {s['images']}   boxes {s['boxes']}   crowd boxes {s['crowd_boxes']}   classes {len(s['classes'])}")
    print(f"  payload {p['store']}" + (f", max side {p['max_side']}" if p["max_side"] else "")
          + (f", quality {p['quality']}" if p["quality"] else "")
          + f"   shards {s['shards']}   on disk {s['bytes'] / 2**20:.1f} MB   records {s['record_bytes'] / 2**20:.1f} MB")
    print(f"  source {s['source']['format']} {s['source']['root']}" + (f" [{s['source']['split']}]" if s['source']['split'] else ""))
    print("  image long side: " + "  ".join(f"{k}: {v}" for k, v in s["long_side_histogram"].items() if v))
    print("  common sizes (w x h): " + "  ".join(f"{k}: {v}" for k, v in s["common_sizes"].items()))
    used = sorted((c for c in s["classes"] if c["boxes"]), key=lambda c: -c["boxes"])
    print(f"  classes with boxes ({len(used)} of {len(s['classes'])}):")
    for c in used:
        print(f"    {c['id']:4d} {c['name']:<20} (source id {c['source_id']}) {c['boxes']:7d}")
    for kind in ("errors", "notes"):
        if s["report"][kind]:
            print(f"  pack {kind}: " + ", ".join(f"{k} {v}" for k, v in s["report"][kind].items()))
    return EXIT_OK


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="re-check every record's CRC (and decode every image)")
    p.add_argument("store", type=Path)
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.add_argument("--workers", type=int, help="processes (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    from .pack.run import default_workers
    from .store.format import FormatError
    from .store.verify import verify

    try:
        res = verify(args.store, decode=args.decode, workers=args.workers or default_workers(),
                     progress=not args.quiet)
    except FormatError as e:
        return _fail(str(e))
    if res.ok:
        extra = f", {res.decoded} images decoded" if args.decode else ""
        print(f"{res.path}: OK, {res.checked} records checked{extra}")
        return EXIT_OK
    print(f"{res.path}: {len(res.damaged)} damaged record(s) or shard(s):")
    for d in res.damaged[:50]:
        print(f"  {d['shard']} record {d['index']}: {d['error']}" if d["index"] is not None else f"  {d['error']}")
    if len(res.damaged) > 50:
        print(f"  ... and {len(res.damaged) - 50} more")
    print("re-pack the dataset (or restore the damaged shard from a copy)")
    return EXIT_FAIL


# --- bench ----------------------------------------------------------------------------------------

def _workers_arg(value: str):
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'auto', got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'auto', got {value!r}")
    return n


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench", help="measure loaders side by side: throughput, stage times, stalls, CPU, memory",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run each --loader in turn, in this process, on the same store and settings, and report\n"
                    "images/s and batches/s (median and spread over intervals, after warm-up), time to the first\n"
                    "batch, per-sample stage times (read, decode, augment, collate, host->device copy), CPU per\n"
                    "core, peak memory summed over the process and its workers, and any shared cache.\n"
                    "With --step-ms, a training step of that length is simulated (the host sleeps, as it does\n"
                    "while an accelerator computes) and the share of time spent waiting for data is reported.",
        epilog="examples:\n"
               "  fastfeed bench --data sample.ff --loader cpu --seconds 5 --imgsz 320\n"
               "  fastfeed bench --data coco.ff --loader all --workers auto --plot bench.png --json bench.json\n"
               "  fastfeed bench --data coco.ff --loader cpu --step-ms 50    # would a 50 ms step starve?")
    p.add_argument("--data", type=Path, required=True, help="a store made by `fastfeed pack`")
    p.add_argument("--loader", action="append", dest="loaders", metavar="NAME",
                   help="loader to measure; repeat for several, 'all' for every registered one (default: cpu)")
    p.add_argument("--imgsz", type=int, default=640, help="output side, a multiple of 32 (default 640)")
    p.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    p.add_argument("--workers", type=_workers_arg, metavar="N|auto",
                   help="worker processes (0: in this process; default: LoaderConfig's, one per core up to 8); "
                        "'auto' sweeps 1, 2, cores/2, cores, cores+1 briefly and keeps the fastest")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seconds", type=float, default=10.0, help="timed seconds per loader (default 10)")
    g.add_argument("--batches", type=int, help="timed batches per loader instead of --seconds")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches first, the first batch included (default 2)")
    p.add_argument("--no-augment", dest="augment", action="store_false",
                   help="letterboxed evaluation batches instead of mosaic/affine/HSV training batches")
    p.add_argument("--device", default="cpu", help="cpu (no copy stage), cuda or npu: also time the host->device copy")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--step-ms", type=float, metavar="MS",
                   help="simulate an accelerator step of MS milliseconds; report the stall fraction and steps/s")
    g.add_argument("--model", choices=("yolov3-tiny", "yolov3"),
                   help="run the bundled model's training step instead of a simulated one")
    p.add_argument("--seed", type=int, default=0, help="loader seed (default 0)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every figure, the machine and the configuration")
    p.add_argument("--plot", type=Path, metavar="FILE.png",
                   help="write a PNG: throughput bars and per-sample stage times (needs fastfeed[plot])")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from .bench import BenchConfig, BenchError, format_table, run_bench, write_plot
    from .store.format import FormatError

    try:
        cfg = BenchConfig(data=args.data, loaders=tuple(args.loaders or ("cpu",)), imgsz=args.imgsz,
                          batch_size=args.batch, workers=args.workers, seconds=args.seconds, batches=args.batches,
                          warmup=args.warmup, augment=args.augment, device=args.device, step_ms=args.step_ms,
                          model=args.model, seed=args.seed, progress=not args.quiet)
        if args.plot is not None:
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:   # say so before minutes of measuring
                return _fail("--plot needs matplotlib: pip install fastfeed[plot]")
        res = run_bench(cfg)
    except FormatError as e:        # a ValueError too, but a bad path is not a usage error
        return _fail(str(e))
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    except (BenchError, ImportError) as e:
        return _fail(str(e))
    print(format_table(res), end="")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        try:
            write_plot(res, args.plot)
        except ImportError as e:
            return _fail(str(e))
        print(f"wrote {args.plot}")
    return EXIT_OK if any(r.ok for r in res.results) else EXIT_FAIL


# --- entry ----------------------------------------------------------------------------------------

def _fail(message: str, code: int = EXIT_FAIL) -> int:
    print(f"fastfeed: error: {message}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastfeed", description="Keep a detection trainer's accelerator fed: pack a dataset, "
                                     "check it, and serve it fast.")
    parser.add_argument("--version", action="version", version=f"fastfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_pack, _add_inspect, _add_verify, _add_bench):
        add(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="fastfeed: %(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return _fail("interrupted; nothing was left half-written", 130)
