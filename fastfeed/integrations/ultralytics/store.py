"""The data.yaml's train split as a fastfeed store: packed on first use, reused while the source is unchanged
(`fastfeed.pack.signature.source_signature`: names, sizes and modification times of the files a pack would read),
re-packed when one changes (`FASTFEED_STORE=PATH` uses an existing store). It is named after the signature,
`<split>[-<task>]-<signature>.ff` (e.g. coco128/train2017-3fa9c1d2e4.ff; the task for segment, pose and OBB, so
two tasks on one dataset keep a store each), beside the dataset when its folder is writable, else in the store
folder (docs/design.md, 'Vocabulary'); the versions it replaces are removed. A new name per version means a process
that still has the previous one open never reads it in place of the new one. A file lock makes concurrent trainers
(DDP ranks on other nodes, a second job) wait for one pack instead of packing twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

from ... import tasks
from ...pack import PackConfig, PackError, pack
from ...pack.datayaml import labels_dir_for, load_yaml, pose_of, read_data_yaml, single
from ...pack.signature import source_signature
from ...pack.writer import pack_lock
from ...store import Store
from ...store.format import MANIFEST, FormatError
from ...store.options import StoreOptions
from ...store.urls import is_url
from .args import log

STORE_ENV = "FASTFEED_STORE"
STORE_DIR_ENV = "FASTFEED_STORE_DIR"
SIGNATURE_FILE = "ultralytics.json"
_SIG_CHARS = 10    # of the signature, in the store's name
_LAYOUT = ("fastfeed packs a train split given as a folder of images whose labels are where Ultralytics finds "
           "them, its path with 'labels' for the last 'images' (<root>/images/<split> + <root>/labels/<split>, or "
           "Roboflow's <split>/images + <split>/labels)")


def train_source(train) -> tuple[Path, Path, str]:
    """(images folder, where its stores go, their name) of data.yaml's `train` entry (as Ultralytics resolved
    it): coco128/images/train2017 -> (that, coco128, train2017); a Roboflow export's export/train/images ->
    (that, export/train, train); coco128/images -> (that, coco128, train)."""
    train, n = single(train)
    if train is None:
        raise ValueError(f"data.yaml lists {n} train folders; {_LAYOUT}. Pack them into one store yourself "
                         f"(`fastfeed pack`) and set {STORE_ENV}=PATH")
    path = Path(train)
    if not path.exists():
        raise ValueError(f"data.yaml's train split {path} does not exist: check its 'train:' entry (Ultralytics "
                         "takes it relative to the data.yaml's 'path:')")
    if not path.is_dir():
        raise ValueError(f"data.yaml's train split {path} is a file (a list of images), not a folder; {_LAYOUT}. "
                         f"Pack the images yourself (`fastfeed pack`) and set {STORE_ENV}=PATH")
    if labels_dir_for(path) is None:
        raise ValueError(f"train split {path} is not under an 'images' folder, so its labels cannot be found; "
                         f"{_LAYOUT}. Pack it yourself (`fastfeed pack`) and set {STORE_ENV}=PATH")
    if path.name == "images":
        return path, path.parent, "train"
    return path, path.parent.parent if path.parent.name == "images" else path.parent, path.name


def _writable(folder: Path) -> bool:
    probe = folder / f".fastfeed-write-probe-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
        return True
    except OSError:
        return False


def store_stem(root: Path, name: str) -> Path:
    """Where the stores of this split go, without the version: `<folder>/<stem>-<signature>.ff`. Beside the
    dataset when writable, else in the store folder (there named after the dataset's path too)."""
    if os.environ.get(STORE_DIR_ENV):
        folder = Path(os.environ[STORE_DIR_ENV])
    elif _writable(root):
        return root / name
    else:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastfeed" / "ultralytics"
    folder.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
    return folder / f"{root.name}-{tag}-{name}"


def check_data(data) -> None:
    """ValueError when Ultralytics' `data` names a fastfeed store (Ultralytics reads a data.yaml: names, val split)."""
    if isinstance(data, (str, os.PathLike)) and (Path(data) / MANIFEST).is_file():
        raise ValueError(f"data={data} is a fastfeed store, not a dataset: give data= the dataset's data.yaml (class "
                         f"names, the val split) and {STORE_ENV}={data} to train from this store")


def open_env_store(options: StoreOptions | None = None) -> Store | None:
    """The store $FASTFEED_STORE names (a URL read with `options`: fields not given from the environment), or None
    when it is not set; errors name the variable."""
    path = os.environ.get(STORE_ENV)
    if not path:
        return None
    if not is_url(path) and not Path(path).exists():   # a URL (s3://...) is read through the node's shard cache
        raise ValueError(f"{STORE_ENV}={path}: no such store (the path does not exist); pack one there "
                         f"(`fastfeed pack data.yaml -o {path}`) or unset {STORE_ENV} to pack data.yaml's train split")
    try:
        store = Store(path, options=options)
    except FormatError as e:
        raise ValueError(f"{STORE_ENV}={path}: {e}") from None
    log.info(f"fastfeed: training from {store.path} ({len(store)} images; {STORE_ENV})")
    return store


def _names(names) -> list[str] | None:
    names = [names[k] for k in sorted(names)] if isinstance(names, dict) else names
    return None if names is None else [str(n) for n in names]


def prepare_store(train, progress: bool = True, names=None, options: StoreOptions | None = None, task: str = "detect",
                  data_yaml=None) -> Store:
    """The store for data.yaml's `train` entry: $FASTFEED_STORE, or packed/reused as described above.
    `names`: data.yaml's class names (a list or {id: name}), the store's classes; `options`: how a store at a URL
    is read (`FastfeedTrainer.store_options`); `task`: the labels packed (`fastfeed pack --task`); `data_yaml`: the
    data.yaml file, whose kpt_shape and flip_idx a pose pack reads when its train: entry is this folder."""
    store = open_env_store(options)
    if store is not None:
        return store
    images, root, name = train_source(train)
    names = _names(names)
    spec = tasks.get(task)
    stem = store_stem(root, f"{name}-{task}" if spec.field else name)
    try:
        # One pack for every process that asks (other nodes, a second job); the lock file goes with the pack.
        with pack_lock(stem.with_name(f"{stem.name}.ff"), wait=True):
            return _packed(images, stem, names, progress, task, _task_yaml(images, data_yaml) if spec.data_yaml_keys else None)
    except PackError as e:
        how = ""
        for flag, when in (("--allow-background-only", "if the set really is all background"),
                           ("--max-dropped", "to train without what was dropped")):
            if flag in str(e):   # a flag of `fastfeed pack`, which this trainer cannot pass
                how = (f"\nFastfeedTrainer packs without that option: {when}, pack it yourself (`fastfeed pack {root} "
                       f"-o train.ff {flag}{' SHARE' if flag == '--max-dropped' else ''}`) and set FASTFEED_STORE=train.ff")
                break
        raise ValueError(f"fastfeed cannot pack the train split {images}: {e}{how}") from None


def _task_yaml(images: Path, data_yaml) -> Path | None:
    """The data.yaml to pack a task's split from (a pose set's kpt_shape and flip_idx): `data_yaml` when its train: entry is
    `images`; None (the data.yaml beside the dataset, if any) otherwise."""
    with contextlib.suppress(PackError, OSError):
        if data_yaml and read_data_yaml(Path(data_yaml)).folder("train").resolve() == images.resolve():
            return Path(data_yaml)
    return None


def _reusable(out: Path, signature: str, task: str, yaml: Path | None) -> Store | None:
    """The store at `out` when it was packed from this source for this task (and, for pose, the keypoint shape
    and flip order data.yaml gives now)."""
    try:   # the signature recorded at its pack
        if json.loads((out / SIGNATURE_FILE).read_text(encoding="utf-8")).get("signature") != signature:
            return None
    except (OSError, ValueError, AttributeError):
        return None
    store = Store(out)
    m = store.manifest
    if getattr(m, "task", "detect") != task:
        return None
    if yaml is not None and list(pose_of(load_yaml(yaml), yaml)) != [m.kpt_shape, m.flip_idx]:
        return None
    return store


def _packed(images: Path, stem: Path, names: list[str] | None, progress: bool, task: str = "detect",
            yaml: Path | None = None) -> Store:
    signature = source_signature(images, "yolo", names=names, task=task)
    out = stem.with_name(f"{stem.name}-{signature[:_SIG_CHARS]}.ff")
    if (store := _reusable(out, signature, task, yaml)) is not None:
        log.info(f"fastfeed: reusing {out} ({len(store)} images; the source is unchanged)")
        return store
    old = [p for p in stem.parent.glob(f"{stem.name}-{'[0-9a-f]' * _SIG_CHARS}.ff")   # this module's, any signature
           if p != out and (p / SIGNATURE_FILE).is_file()]
    why = "the source changed since it was packed" if old else "first use"
    log.info(f"fastfeed: packing {images} into {out} ({why})")
    src, split = (yaml, "train") if yaml is not None else (images, None)
    res = pack(PackConfig(src=src, split=split, out=out, format="yolo", names=names, overwrite=True, progress=progress,
                          task=task))
    m = res.manifest
    log.info(f"fastfeed: packed {m.num_images} images, {m.num_boxes} boxes in {res.seconds:.1f} s"
             + (f"; {res.report.images_rejected} image(s) skipped, see {out / 'rejects.jsonl'}"
                if res.report.images_rejected else ""))
    for line in res.report.summary_lines():
        log.info(f"fastfeed:   {line}")
    (out / SIGNATURE_FILE).write_text(json.dumps({"signature": signature, "images": str(images)}), encoding="utf-8")
    for p in old:
        log.info(f"fastfeed: removing {p} (packed from an earlier version of the source)")
        shutil.rmtree(p, ignore_errors=True)
    return Store(out)


def check_boxes(store: Store) -> None:
    """A store without a single box would train with a box loss of 0: refuse it."""
    if store.manifest.num_boxes == 0:
        raise ValueError(f"{store.path} holds {len(store)} images and not one box: there is nothing to train on. "
                         "Check that the labels are where data.yaml's train: images are, with 'labels' for "
                         f"'images' in the path (or the store {STORE_ENV} names)")


def check_classes(store: Store, names: dict, nc: int) -> None:
    """The store's class ids must be data.yaml's: the same names where the store has names, and no boxes of
    a class data.yaml does not have (extra classes without boxes are only a warning: nothing trains on them)."""
    ours = store.class_names
    if len(ours) > nc:
        boxes = store.manifest.stats.get("class_boxes", [])
        used = [(k, ours[k], boxes[k]) for k in range(nc, len(ours)) if k < len(boxes) and boxes[k]]
        extra = ", ".join(f"{k} {ours[k]!r}" for k in range(nc, min(len(ours), nc + 10)))
        if used:
            raise ValueError(f"{store.path} has {len(ours)} classes, data.yaml names {nc}: the store's labels use "
                             f"class ids data.yaml does not define ({', '.join(f'{k} {n!r}: {b} boxes' for k, n, b in used[:10])}); "
                             "fix the labels or data.yaml's 'names'")
        log.warning(f"fastfeed: {store.path} names {len(ours)} classes, data.yaml {nc}; the extra ones ({extra}) have "
                    "no boxes in the store, so training with data.yaml's classes loses nothing")
        ours = ours[:nc]
    if all(n.isdigit() for n in ours):   # packed without class names: ids only
        return
    if bad := [(k, a, b) for k, (a, b) in enumerate(zip(ours, _names(names))) if a != b]:
        k, a, b = bad[0]
        raise ValueError(f"{store.path} names class {k} {a!r} but data.yaml names it {b!r} ({len(bad)} differ): the "
                         f"store was packed from another class list; re-pack it or unset {STORE_ENV}")


def check_task(store: Store, task: str, data: dict, trainer: str) -> None:
    """A segment, pose or OBB trainer trains on a store of its task only (a detect trainer takes any store: its
    boxes); a pose store's kpt_shape and flip_idx must be data.yaml's (the model is built from data.yaml's)."""
    m = store.manifest
    have = getattr(m, "task", "detect")
    spec = tasks.get(task)
    if spec.field and have != task:
        raise ValueError(f"{store.path} is a store of {have} labels but {trainer} trains {task}: pack the train split "
                         f"for it (`fastfeed pack data.yaml -o train-{task}.ff --task {task}`) or unset {STORE_ENV} to "
                         "let the trainer pack it")
    for key in spec.data_yaml_keys:
        ours, theirs = (None if v is None else list(v) for v in (getattr(m, key), data.get(key)))
        if ours != theirs:
            raise ValueError(f"{store.path} holds keypoints with {key} {ours}, data.yaml gives {theirs}: the store was "
                             f"packed from another keypoint layout; fix data.yaml's {key}, or re-pack the store (unset "
                             f"{STORE_ENV} to let the trainer pack it)")


def check_kpt_shape(data: dict, options: StoreOptions | None = None) -> dict:
    """`data` (Ultralytics' data.yaml); a pose one without kpt_shape (Ultralytics' PoseTrainer: a KeyError) is refused
    by name: what to add is the keypoint layout of the store $FASTFEED_STORE names, when it has one."""
    if data.get("kpt_shape") is None:
        m = getattr(open_env_store(options), "manifest", None)
        given = " and ".join(f"`{k}: {v}`" for k in ("kpt_shape", "flip_idx") if (v := getattr(m, k, None)) is not None)
        what = f"{given} (the store's, {STORE_ENV})" if given else "`kpt_shape: [K, 2 or 3]` (K keypoints of x, y or x, y, visibility)"
        raise ValueError(f"{data.get('yaml_file', 'data.yaml')} has no kpt_shape, which a pose model is built from: add {what} to it")
    return data
