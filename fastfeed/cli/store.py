"""`fastfeed inspect` and `fastfeed verify`."""

from __future__ import annotations

import json

from .. import tasks
from .common import EXIT_FAIL, EXIT_OK, add_remote_args, fail, int_or_auto, store_options, store_path

INSPECT_HELP = "summarise a store: task, counts, classes, image sizes, bytes"
VERIFY_HELP = "re-check every record's CRC (and decode every image)"

def add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help=INSPECT_HELP)
    p.add_argument("store", type=store_path, help="a store folder, or its URL (s3://bucket/coco.ff)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_remote_args(p)
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args) -> int:
    from ..store.verify import summarize

    try:
        s = summarize(args.store, options=store_options(args))
    except (ValueError, ImportError) as e:   # a FormatError (not a store, damaged) is a ValueError
        return fail(e)
    if args.json:
        print(json.dumps(s, indent=1))
        return EXIT_OK
    p = s["payload"]
    print(f"{s['path']}  (format v{s['format_version']}, created {s['created']}, fingerprint {s['fingerprint']})")
    print(f"  images {s['images']}   boxes {s['boxes']}   crowd boxes {s['crowd_boxes']}   classes {len(s['classes'])}")
    print(f"  payload {p['store']}" + (f", max side {p['max_side']}" if p["max_side"] else "")
          + (f", quality {p['quality']}" if p["quality"] else "")
          + f"   shards {s['shards']}   on disk {s['bytes'] / 2**20:.1f} MB   records {s['record_bytes'] / 2**20:.1f} MB")
    line = tasks.get(s["task"]["name"]).describe(s["task"])   # None for detect: boxes only
    print(f"  task {s['task']['name']}" if line is None else f"  {line}")
    print(f"  source {s['source']['format']} {s['source']['root']}" + (f" [{s['source']['split']}]" if s['source']['split'] else ""))
    print("  image long side: " + "  ".join(f"{k}: {v}" for k, v in s["long_side_histogram"].items() if v))
    print("  common sizes (w x h): " + "  ".join(f"{k}: {v}" for k, v in s["common_sizes"].items()))
    used = sorted((c for c in s["classes"] if c["boxes"]), key=lambda c: -c["boxes"])
    print(f"  classes with boxes ({len(used)} of {len(s['classes'])}):")
    for c in used:
        print(f"    {c['id']:4d} {c['name']:<20} (source id {c['source_id']}) {c['boxes']:7d}")
    empty = [c for c in s["classes"] if not c["boxes"]]
    if empty:   # a model trained on this store never sees them: often a names list that does not fit the labels
        print(f"  classes without boxes ({len(empty)} of {len(s['classes'])}): "
              + ", ".join(f"{c['id']} {c['name']}" for c in empty[:40]) + (" ..." if len(empty) > 40 else ""))
    for kind in ("errors", "notes"):
        if s["report"][kind]:
            print(f"  pack {kind}: " + ", ".join(f"{k} {v}" for k, v in s["report"][kind].items()))
    return EXIT_OK


def add_verify(sub) -> None:
    p = sub.add_parser("verify", help=VERIFY_HELP)
    p.add_argument("store", type=store_path, help="a store folder, or its URL (every shard is downloaded afresh from "
                                                  "the bucket into the shard cache, its sha256 checked)")
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.add_argument("--workers", type=int_or_auto("an integer >= 0", 0, auto=False),
                   help="processes (0: all cores; default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_remote_args(p)
    p.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    from ..procs import usable_cores
    from ..store import urls
    from ..store.verify import verify

    try:
        res = verify(args.store, decode=args.decode, workers=args.workers or usable_cores(),
                     progress=not args.quiet, options=store_options(args))
    except (ValueError, ImportError) as e:   # a FormatError (not a store, damaged) is a ValueError
        return fail(e)
    if res.ok:
        extra = f", {res.decoded} images decoded" if args.decode else ""
        print(f"{res.path}: OK, {res.checked} records checked{extra}")
        return EXIT_OK
    print(f"{res.path}: {len(res.damaged)} damaged record(s) or shard(s):")
    for d in res.damaged[:50]:
        print(f"  {d['shard']} record {d['index']}: {d['error']}" if d["index"] is not None else
              f"  {d['error']}" if d["shard"] in d["error"] else f"  {d['shard']}: {d['error']}")
    if len(res.damaged) > 50:
        print(f"  ... and {len(res.damaged) - 50} more")
    print("the bucket holds damaged objects: restore them, or re-pack the store (fastfeed pack SRC -o URL --force)"
          if urls.is_url(args.store) else "re-pack the dataset (or restore the damaged shard from a copy)")
    return EXIT_FAIL
