"""`fastfeed loaders`: the registered loaders, whether each runs here (and why not), and their options."""

from __future__ import annotations

import json

from .common import EXIT_OK

HELP = "list the loaders, whether each can run on this machine, and their options"

def add_parser(sub) -> None:
    p = sub.add_parser(
        "loaders", help=HELP,
        description="List every registered loader with what it does, whether it can run here (and what to\n"
                    "install when it cannot), and its own options with their defaults. Options go to\n"
                    "create_loader(name, store, LoaderConfig(...), **options); LoaderConfig holds what\n"
                    "every loader shares (imgsz, batch_size, workers, device, hyp, ...).")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..loaders import loader_info

    infos = loader_info()
    if args.json:
        print(json.dumps([{"name": i.name, "summary": i.summary, "available": i.available,
                           "unavailable": i.unavailable, "options": i.options} for i in infos], indent=1))
        return EXIT_OK
    for i in infos:
        print(f"{i.name:8} {'available' if i.available else 'not available: ' + i.unavailable}")
        print(f"{'':8} {i.summary}")
        if i.options:
            print(f"{'':8} options: " + ", ".join(f"{k}={v!r}" for k, v in i.options.items()))   # as create_loader takes them
    return EXIT_OK
