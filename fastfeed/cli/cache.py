"""`fastfeed cache`: list, remove or pre-build the `shm` loader's shared decoded-image caches."""

from __future__ import annotations

import argparse
import json
import os

from ..renamed import old_flag
from . import common
from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_remote_args, defaults, exact, fail, store_options, store_path

HELP = "list, remove or pre-build the shm loader's decoded-image caches (in /dev/shm) and the shard caches of stores in object storage"

def add_parser(sub) -> None:
    from ..loaders import LoaderConfig
    from ..loaders.shm import ShmOptions

    DEFAULT_DIR = defaults(ShmOptions)["cache_dir"]
    imgsz = defaults(LoaderConfig)["imgsz"]
    p = sub.add_parser(
        "cache", help=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The shm loader keeps one decoded-image cache per store and imgsz in shared memory, one\n"
                    "file (a slab: /dev/shm/fastfeed-<store fingerprint>-<imgsz>-v<version>.cache), built by the\n"
                    "first process that asks and shared by every worker and rank on the node. It is removed when\n"
                    "its last user exits, unless it was built with keep; one that a killed run left with no live\n"
                    "user is removed by the next cache open and by `ls` (listed as reclaimed).\n\n"
                    "A store in object storage (s3://...) is read through a node-local shard cache\n"
                    "($FASTFEED_SHARD_CACHE, default ~/.cache/fastfeed/shards): `ls` and `clear` show and remove it\n"
                    "too (--shards: only it; --shm: only the shm caches).",
        epilog="examples:\n"
               "  fastfeed cache ls\n"
               "  fastfeed cache clear                 # slabs no running process uses\n"
               "  fastfeed cache clear --force         # all of them\n"
               "  fastfeed cache build coco.ff --imgsz 640   # once, before `torchrun ... --loader shm`; kept\n"
               "  fastfeed cache build s3://bucket/coco.ff    # the same from object storage (shards streamed)\n"
               "  fastfeed cache clear --shards              # downloaded shards no running process uses")
    p.set_defaults(func=lambda args: (p.print_help(), EXIT_USAGE)[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=exact)
    shm = argparse.ArgumentParser(add_help=False)
    shm.add_argument("--shm-dir", default=DEFAULT_DIR, help=f"the shm caches' folder (default {DEFAULT_DIR})")
    old_flag(shm, "--dir", "--shm-dir")

    ls = actions.add_parser("ls", parents=[shm], help="list slabs: size, store fingerprint, imgsz, images, users")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    _which(ls)
    ls.set_defaults(func=cmd_ls)

    clear = actions.add_parser("clear", parents=[shm], help="remove slabs no running process uses (--force: all)")
    clear.add_argument("--force", action="store_true",
                       help="also remove slabs in use or being built (their users keep what they mapped)")
    _which(clear)
    clear.set_defaults(func=cmd_clear)

    build = actions.add_parser("build", parents=[shm], help="build a store's shm cache now, kept for later runs")
    build.add_argument("store", type=store_path, help="a store made by `fastfeed pack`: a folder or its URL")
    build.add_argument("--imgsz", type=int, default=imgsz, help=f"the loaders' imgsz, a multiple of 32 (default {imgsz})")
    build.add_argument("--partial", action="store_true", help="if it does not fit, cache the first images that do")
    build.add_argument("--workers", type=common.int_or_auto("an integer >= 0", 0, auto=False),
                       help="decoding processes (0: all cores; default: all cores)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    add_remote_args(build)
    build.set_defaults(func=cmd_build)


def _which(p) -> None:
    from ..store.remote.sizes import default_dir

    g = p.add_mutually_exclusive_group()
    g.add_argument("--shards", action="store_true", help="only the shard cache of stores in object storage")
    g.add_argument("--shm", action="store_true", help="only the shm loader's decoded-image caches")
    p.add_argument("--shard-cache", metavar="DIR", help=f"the shard cache (default $FASTFEED_SHARD_CACHE, else {default_dir()})")
    old_flag(p, "--shard-dir", "--shard-cache")


def _users(info) -> str:
    text = f"{len(info.users)}" + (f" (pid {', '.join(map(str, info.users))})" if info.users else "")
    return text + (", keep" if info.keep else "")


def cmd_ls(args) -> int:
    from ..cache import CacheError, list_caches
    from ..store.remote.sizes import human_bytes

    if args.shards:
        return _ls_shards(args)
    try:
        infos = list_caches(args.shm_dir)
    except CacheError as e:
        return fail(str(e))
    if args.json:
        print(json.dumps([vars(i) for i in infos], indent=1, default=str))   # a path as its text
        return EXIT_OK
    if not infos:
        print(f"{args.shm_dir}: no fastfeed caches")
    else:
        print(f"{args.shm_dir}: {len(infos)} fastfeed cache(s), {human_bytes(sum(i.bytes for i in infos))}")
        _table([("SLAB", "SIZE", "STORE", "IMGSZ", "IMAGES", "STATE", "USERS")] + [
            (i.path.name, human_bytes(i.bytes), i.fingerprint, str(i.imgsz),
             f"{i.n_cached}/{i.n_records}" if i.state == "complete" else "-", i.state, _users(i)) for i in infos])
        for i in infos:
            if i.note:
                print(f"  {i.path.name}: {i.note}")
    return EXIT_OK if args.shm else _ls_shards(args, quiet_if_empty=True)   # the shard caches too


def _ls_shards(args, quiet_if_empty: bool = False) -> int:
    from ..store.remote.manage import list_shard_caches
    from ..store.remote.sizes import default_dir, human_bytes

    root = store_options(args).shard_cache or default_dir()
    infos = list_shard_caches(root)
    if args.json:
        print(json.dumps([vars(i) for i in infos], indent=1, default=str))   # a path as its text
        return EXIT_OK
    if not infos:
        if not quiet_if_empty:
            print(f"{root}: no shard caches")
        return EXIT_OK
    print(f"shard cache {root}: {len(infos)} store(s), {human_bytes(sum(i.bytes for i in infos))}")
    _table([("STORE", "SHARDS", "SIZE", "IN USE", "DOWNLOADS", "NEEDED BY")] + [
        (i.url, str(i.shards), human_bytes(i.bytes), str(i.in_use), f"{i.downloads} ({human_bytes(i.downloaded_bytes)})",
         ", ".join(map(str, i.pinned_by)) or "-") for i in infos])
    return EXIT_OK


def _table(rows) -> None:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def _clear_shards(args) -> int:
    from ..store.remote.manage import clear_shard_caches
    from ..store.remote.sizes import default_dir, human_bytes

    root = store_options(args).shard_cache or default_dir()
    removed, kept = clear_shard_caches(root, force=args.force)
    for i in removed:
        print(f"removed the shard cache of {i.url} ({i.shards} shards, {human_bytes(i.bytes)})")
    for i in kept:
        print(f"kept the shard cache of {i.url}: {i.note}")
    if removed or kept or args.shards:
        print(f"shard cache {root}: {len(removed)} removed, {human_bytes(sum(i.bytes for i in removed))} freed; "
              f"{len(kept)} kept")
    return EXIT_OK


def cmd_clear(args) -> int:
    from ..cache import CacheError, clear_caches
    from ..store.remote.sizes import human_bytes

    if args.shards:
        return _clear_shards(args)
    try:
        removed, kept = clear_caches(args.shm_dir, force=args.force)
    except CacheError as e:
        return fail(str(e))
    for i in removed:
        print(f"removed {os.path.join(args.shm_dir, i.path.name)} ({human_bytes(i.bytes)})")
    for i in kept:
        print(f"kept {os.path.join(args.shm_dir, i.path.name)}: {i.note}")
    print(f"{len(removed)} removed, {human_bytes(sum(i.bytes for i in removed))} freed; {len(kept)} kept")
    return EXIT_OK if args.shm else _clear_shards(args)


def cmd_build(args) -> int:
    from ..cache import CacheError, acquire
    from ..checks import imgsz_error
    from ..store import Store
    from ..store.remote.sizes import human_bytes

    if (msg := imgsz_error(args.imgsz)) is not None:
        return fail(msg, EXIT_USAGE)
    try:
        store = Store(args.store, options=store_options(args))
        lease = acquire(store, args.imgsz, args.shm_dir, partial=args.partial, keep=True, workers=args.workers,
                        progress=False if args.quiet else None)
    except (CacheError, ValueError, ImportError) as e:   # a FormatError is a ValueError
        return fail(e)
    lease.release()   # kept: it stays for the runs that follow
    what = "built" if lease.built else "already there"
    print(f"{lease.path}: {what}, {lease.n_cached}/{lease.n_records} images, {human_bytes(lease.size)}; kept until "
          "`fastfeed cache clear`")
    return EXIT_OK if lease.n_cached == lease.n_records or args.partial else EXIT_FAIL
