"""`fastfeed cache`: list, remove or pre-build the `shm` loader's shared decoded-image caches."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, default, fail

HELP = "list, remove or pre-build the shm loader's decoded-image caches (in /dev/shm)"

def add_parser(sub) -> None:
    from ..loaders import LoaderConfig
    from ..loaders.shm import ShmOptions

    DEFAULT_DIR = default(ShmOptions, "cache_dir")
    imgsz = default(LoaderConfig, "imgsz")
    p = sub.add_parser(
        "cache", help=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The shm loader keeps one decoded-image cache per store and imgsz in shared memory\n"
                    "(/dev/shm/fastfeed-<store fingerprint>-<imgsz>-v<version>.cache), built by the first process\n"
                    "that asks and shared by every worker and rank on the node. It is removed when its last user\n"
                    "exits, unless it was built with keep; a crashed run leaves it behind with no live users.",
        epilog="examples:\n"
               "  fastfeed cache ls\n"
               "  fastfeed cache clear                 # segments no running process uses\n"
               "  fastfeed cache clear --force         # all of them\n"
               "  fastfeed cache build coco.ff --imgsz 640   # once, before `torchrun ... --loader shm`; kept")
    p.set_defaults(func=lambda args: (p.print_help(), EXIT_USAGE)[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    ls = actions.add_parser("ls", help="list segments: size, store fingerprint, imgsz, images, users")
    ls.add_argument("--dir", default=DEFAULT_DIR, help=f"cache directory (default {DEFAULT_DIR})")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=cmd_ls)

    clear = actions.add_parser("clear", help="remove segments no running process uses (--force: all)")
    clear.add_argument("--dir", default=DEFAULT_DIR, help=f"cache directory (default {DEFAULT_DIR})")
    clear.add_argument("--force", action="store_true",
                       help="also remove segments in use or being built (their users keep what they mapped)")
    clear.set_defaults(func=cmd_clear)

    build = actions.add_parser("build", help="build a store's cache now and keep it for the runs that follow")
    build.add_argument("store", type=Path, help="a store made by `fastfeed pack`")
    build.add_argument("--imgsz", type=int, default=imgsz, help=f"the loaders' imgsz, a multiple of 32 (default {imgsz})")
    build.add_argument("--dir", default=DEFAULT_DIR, help=f"cache directory (default {DEFAULT_DIR})")
    build.add_argument("--partial", action="store_true", help="if it does not fit, cache the first images that do")
    build.add_argument("--workers", type=int, help="decoding processes (default: all cores)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(func=cmd_build)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _users(info) -> str:
    text = f"{len(info.users)}" + (f" (pid {', '.join(map(str, info.users))})" if info.users else "")
    return text + (", keep" if info.keep else "")


def cmd_ls(args) -> int:
    from ..cache import CacheError, list_caches

    try:
        infos = list_caches(args.dir)
    except CacheError as e:
        return fail(str(e))
    if args.json:
        print(json.dumps([i.to_dict() for i in infos], indent=1))
        return EXIT_OK
    if not infos:
        print(f"{args.dir}: no fastfeed caches")
        return EXIT_OK
    print(f"{args.dir}: {len(infos)} fastfeed cache(s), {_size(sum(i.bytes for i in infos))}")
    rows = [("SEGMENT", "SIZE", "STORE", "IMGSZ", "IMAGES", "STATE", "USERS")]
    for i in infos:
        images = f"{i.n_cached}/{i.n_records}" if i.state == "complete" else "-"
        rows.append((i.path.name, _size(i.bytes), i.fingerprint, str(i.imgsz), images, i.state, _users(i)))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for i in infos:
        if i.note:
            print(f"  {i.path.name}: {i.note}")
    return EXIT_OK


def cmd_clear(args) -> int:
    from ..cache import CacheError, clear_caches

    try:
        removed, kept = clear_caches(args.dir, force=args.force)
    except CacheError as e:
        return fail(str(e))
    for i in removed:
        print(f"removed {os.path.join(args.dir, i.path.name)} ({_size(i.bytes)})")
    for i in kept:
        print(f"kept {os.path.join(args.dir, i.path.name)}: {i.note}")
    print(f"{len(removed)} removed, {_size(sum(i.bytes for i in removed))} freed; {len(kept)} kept")
    return EXIT_OK


def cmd_build(args) -> int:
    from ..cache import CacheError, acquire
    from ..imgsz import imgsz_error
    from ..store import Store
    from ..store.format import FormatError

    if (msg := imgsz_error(args.imgsz)) is not None:
        return fail(msg, EXIT_USAGE)
    try:
        store = Store(args.store)
        lease = acquire(store, args.imgsz, args.dir, partial=args.partial, keep=True, workers=args.workers,
                        progress=False if args.quiet else None)
    except (FormatError, CacheError) as e:
        return fail(str(e))
    lease.release()   # kept: it stays for the runs that follow
    what = "built" if lease.built else "already there"
    print(f"{lease.path}: {what}, {lease.n_cached}/{lease.n_records} images, {_size(lease.size)}; kept until "
          "`fastfeed cache clear`")
    return EXIT_OK if lease.n_cached == lease.n_records or args.partial else EXIT_FAIL
