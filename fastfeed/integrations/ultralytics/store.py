"""The data.yaml's train split as a fastfeed store: packed on first use, reused while the source is
unchanged, re-packed when an image or label file changes (`FASTFEED_STORE=PATH` uses an existing store).

What "unchanged" means: `fastfeed.pack.signature.source_signature` (names, sizes and modification
times of the files a pack would read). The store is named after it, `<split>-<signature>.ff`, beside
the dataset (e.g. coco128/train2017-3fa9c1d2e4.ff) when its folder is writable, else in
`$FASTFEED_STORE_DIR` or `~/.cache/fastfeed/ultralytics/`; the versions it replaces are removed. A new
name per version also means a process that still has the previous version open never reads it in
place of the new one. A file lock makes concurrent trainers (DDP ranks on other nodes, a second
job) wait for one pack instead of packing twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from ...pack import PackConfig, pack
from ...pack.signature import source_signature
from ...store import Store
from .args import log

STORE_ENV = "FASTFEED_STORE"
STORE_DIR_ENV = "FASTFEED_STORE_DIR"
SIGNATURE_FILE = "ultralytics.json"
_SIG_CHARS = 10    # of the signature, in the store's name
_LAYOUT = ("fastfeed packs a train split given as a folder <root>/images[/<split>] whose labels are in "
           "<root>/labels[/<split>] (Ultralytics' YOLO layout)")


def train_source(train) -> tuple[Path, str | None]:
    """(dataset root, split) of data.yaml's `train` entry, e.g. coco128/images/train2017 -> (coco128, train2017)."""
    if isinstance(train, (list, tuple)):
        if len(train) != 1:
            raise ValueError(f"data.yaml lists {len(train)} train folders; {_LAYOUT}. Pack them into one store "
                             f"yourself (`fastfeed pack`) and set {STORE_ENV}=PATH")
        train = train[0]
    path = Path(train)
    if not path.is_dir():
        raise ValueError(f"train split {path} is not a folder; {_LAYOUT}. For a list of image files, pack them "
                         f"yourself (`fastfeed pack`) and set {STORE_ENV}=PATH")
    if path.name == "images":
        return path.parent, None
    if path.parent.name == "images":
        return path.parent.parent, path.name
    raise ValueError(f"train split {path} is not under an 'images' folder; {_LAYOUT}. Pack it yourself "
                     f"(`fastfeed pack`) and set {STORE_ENV}=PATH")


def _writable(folder: Path) -> bool:
    probe = folder / f".fastfeed-write-probe-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
        return True
    except OSError:
        return False


def store_stem(root: Path, split: str | None) -> Path:
    """Where the stores of this split go, without the version: `<folder>/<stem>-<signature>.ff`. Beside the
    dataset when writable, else in the cache folder (there named after the dataset's path too)."""
    name = split or "train"
    if os.environ.get(STORE_DIR_ENV):
        folder = Path(os.environ[STORE_DIR_ENV])
    elif _writable(root):
        return root / name
    else:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastfeed" / "ultralytics"
    folder.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
    return folder / f"{root.name}-{tag}-{name}"


def _versions(stem: Path) -> list[Path]:
    """Stores this module packed for `stem` (any signature)."""
    return [p for p in stem.parent.glob(f"{stem.name}-{'[0-9a-f]' * _SIG_CHARS}.ff") if (p / SIGNATURE_FILE).is_file()]


@contextmanager
def _locked(stem: Path):
    with open(stem.parent / f".{stem.name}.ff.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _recorded_signature(out: Path) -> str | None:
    try:
        return json.loads((out / SIGNATURE_FILE).read_text(encoding="utf-8")).get("signature")
    except (OSError, ValueError, AttributeError):
        return None


def prepare_store(train, progress: bool = True) -> Store:
    """The store for data.yaml's `train` entry: $FASTFEED_STORE, or packed/reused as described above."""
    if os.environ.get(STORE_ENV):
        store = Store(os.environ[STORE_ENV])
        log.info(f"fastfeed: training from {store.path} ({len(store)} images; {STORE_ENV})")
        return store
    root, split = train_source(train)
    stem = store_stem(root, split)
    with _locked(stem):
        signature = source_signature(root, "yolo", split)
        out = stem.with_name(f"{stem.name}-{signature[:_SIG_CHARS]}.ff")
        if out.is_dir() and _recorded_signature(out) == signature:
            store = Store(out)
            log.info(f"fastfeed: reusing {out} ({len(store)} images; the source is unchanged)")
            return store
        old = [p for p in _versions(stem) if p != out]
        why = "the source changed since it was packed" if old else "first use"
        log.info(f"fastfeed: packing {root / 'images' / (split or '')} into {out} ({why})")
        res = pack(PackConfig(src=root, out=out, format="yolo", split=split, overwrite=True, progress=progress))
        m = res.manifest
        log.info(f"fastfeed: packed {m.num_images} images, {m.num_boxes} boxes in {res.seconds:.1f} s"
                 + (f"; {res.report.images_rejected} image(s) skipped, see {out / 'rejects.jsonl'}"
                    if res.report.images_rejected else ""))
        for line in res.report.summary_lines():
            log.info(f"fastfeed:   {line}")
        (out / SIGNATURE_FILE).write_text(json.dumps({"signature": signature, "root": str(root), "split": split}),
                                          encoding="utf-8")
        for p in old:
            log.info(f"fastfeed: removing {p} (packed from an earlier version of the source)")
            shutil.rmtree(p, ignore_errors=True)
        return Store(out)


def check_classes(store: Store, names: dict, nc: int) -> None:
    """The store's class ids must be data.yaml's: no more classes, and the same names where the store has names."""
    ours = store.class_names
    if len(ours) > nc:
        raise ValueError(f"{store.path} has {len(ours)} classes but data.yaml names {nc}: labels use class ids "
                         f"data.yaml does not define; fix the labels or data.yaml's 'names'")
    if all(n.isdigit() for n in ours):   # packed without class names: ids only
        return
    theirs = [str(names[k]) for k in range(len(ours))] if isinstance(names, dict) else [str(n) for n in names]
    bad = [(k, a, b) for k, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if bad:
        k, a, b = bad[0]
        raise ValueError(f"{store.path} names class {k} {a!r} but data.yaml names it {b!r} ({len(bad)} differ): the "
                         f"store was packed from another class list; re-pack it or unset {STORE_ENV}")
