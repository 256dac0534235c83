"""`fastfeed bench`."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
from pathlib import Path

from .. import tasks
from .common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_remote_args,
    config_of,
    defaults,
    fail,
    int_or_auto,
    progress_lines,
    store_options,
    store_path,
)

HELP = "measure loaders side by side: throughput, stage times, stalls, CPU, memory"

def add_parser(sub) -> None:
    from ..bench.config import BATCH, MODELS, TASKS, BenchConfig

    d = defaults(BenchConfig)
    p = sub.add_parser(
        "bench", help=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run each --loader in turn, in this process, on the same store and settings, and report\n"
                    "images/s and batches/s (over the whole timed window, after warm-up; the spread over ten slices\n"
                    "of it beside), time to the first batch, per-sample stage times (read, decode, augment, collate, host->device copy), CPU per\n"
                    "core, peak memory summed over the process and its workers, and any shared cache. These are each\n"
                    "loader's ceiling, not the training speed: with --step-ms, a training step of that length is\n"
                    "simulated (the host sleeps, as it does while an accelerator computes), with --model the bundled\n"
                    "model's step runs, and the share of time spent waiting for data says which loader keeps it fed.",
        epilog="examples:\n"
               "  fastfeed bench --data sample.ff --loader cpu --seconds 5 --imgsz 320\n"
               "  fastfeed bench --data coco.ff --loader all --workers auto --plot bench.png --json bench.json\n"
               "  fastfeed bench --data coco.ff --loader cpu --step-ms 50    # would a 50 ms step starve?")
    p.add_argument("--data", type=store_path, required=True,
                   help="a store made by `fastfeed pack`: a folder, or its URL (s3://bucket/coco.ff)")
    p.add_argument("--loader", action="append", dest="loaders", metavar="NAME",
                   help="loader to measure; repeat for several, 'all' for every registered one (default: cpu)")
    p.add_argument("--imgsz", type=int, default=d["imgsz"], help=f"output side, a multiple of 32 (default {d['imgsz']})")
    p.add_argument("--batch", type=int, help=f"batch size (default {BATCH}, or the store's size when it holds fewer images)")
    p.add_argument("--workers", type=int_or_auto("an integer >= 0", 0), metavar="N|auto",
                   help="worker processes (0: in this process; default: LoaderConfig's, one per core up to 8); "
                        "'auto' sweeps 1, 2, cores/2, cores, cores+1 briefly and keeps the fastest")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seconds", type=float, default=d["seconds"], help=f"timed seconds per loader (default {d['seconds']:g})")
    g.add_argument("--batches", type=int,
                   help="timed batches per loader instead of --seconds (default: none, --seconds)")
    p.add_argument("--warmup", type=int, default=d["warmup"],
                   help=f"untimed batches first, the first batch included (default {d['warmup']})")
    p.add_argument("--no-augment", dest="augment", action="store_false",
                   help="letterboxed evaluation batches instead of mosaic/affine/HSV training batches")
    p.add_argument("--device", default=d["device"],
                   help="cpu (no copy stage), cuda[:N] or npu[:N]: the batches are for that device (pinned for CUDA; "
                        "dali and device loaders run there) and the host->device copy is timed (default: %(default)s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--step-ms", type=float, metavar="MS",
                   help="simulate an accelerator step of MS milliseconds; report the stall fraction and steps/s "
                        "(default: none, no step)")
    g.add_argument("--model", choices=MODELS,
                   help="run the bundled model's training step instead of a simulated one (default: none)")
    p.add_argument("--task", choices=TASKS,
                   help="what the batches carry: the store's task (default: a segment store's masks, a pose store's "
                        "keypoints, an OBB store's rotated boxes), or detect: boxes alone, from a store of any task "
                        "(what a detection model trains on; the dali loader reads a task store so). --model "
                        "implies detect")
    p.add_argument("--seed", type=int, default=d["seed"], help=f"loader seed (default {d['seed']})")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write every figure, the machine and the configuration (default: none)")
    p.add_argument("--plot", type=Path, metavar="FILE.png",
                   help="write a PNG: throughput bars and per-sample stage times (needs matplotlib: pip install -e "
                        "'.[plot]'; default: none)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar and no progress lines (there is no bar when stderr is not a terminal: "
                        "plain lines say each loader's progress there)")
    add_remote_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench import BenchConfig, format_table, run_bench, write_plot
    from ..devices import DeviceError
    from ..store.format import FormatError

    try:
        cfg = config_of(BenchConfig, args, store_options=store_options(args), loaders=tuple(args.loaders or ("cpu",)),
                        batch_size=args.batch, progress=not args.quiet)
        if args.plot is not None:
            if importlib.util.find_spec("matplotlib") is None:   # say so before minutes of measuring
                return fail("--plot needs matplotlib: pip install -e '.[plot]' in the fastfeed checkout")
            if args.plot.suffix.lower() not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
                return fail(f"--plot {args.plot}: name a .png (or .pdf, .svg, .jpg) file", EXIT_USAGE)
        for flag, path in (("--json", args.json), ("--plot", args.plot)):   # before the measuring, not after it
            if path is not None and path.is_dir():
                return fail(f"{flag} {path} is a folder: name a file (in it, or elsewhere)", EXIT_USAGE)
            if path is not None:   # its folder made now, and writable (else a traceback after the measuring)
                with contextlib.suppress(OSError):
                    path.parent.mkdir(parents=True, exist_ok=True)
                if not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
                    what = ("is read-only here" if path.parent.is_dir() else
                            "is a file, not a folder" if path.parent.exists() else "cannot be made here")
                    return fail(f"{flag} {path}: {path.parent} {what}: name a file in a writable folder", EXIT_USAGE)
        with progress_lines(getattr(args, "verbose", False)) if cfg.progress else contextlib.nullcontext():
            res = run_bench(cfg)
    except FormatError as e:        # a ValueError too, but a bad path is not a usage error
        return fail(e)
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    except (DeviceError, ImportError) as e:
        return fail(str(e))
    print(format_table(res), end="")
    summary = res.store["task"]
    if tasks.get(res.store["batches"]).field is None and tasks.get(summary["name"]).field:
        print(f"task {summary['name']} store read as detection: boxes alone"
              f"{' (--model: the bundled models detect)' if args.model else ''}")
    elif (line := tasks.get(summary["name"]).describe(summary)) is not None:   # what the batches carried besides boxes
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(res.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        try:
            write_plot(res, args.plot)
        except ImportError as e:
            return fail(str(e))
        print(f"wrote {args.plot}")
    return EXIT_OK if any(r.ok for r in res.results) else EXIT_FAIL
