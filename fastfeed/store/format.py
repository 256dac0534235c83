"""The on-disk format of a fastfeed store: the one place that knows file names, keys, the manifest and the version
(docs/format.md describes the same for people). A record's byte layout and its `Record` are `record.py`'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

FORMAT_NAME = "fastfeed"
FORMAT_VERSION = 4   # 2: the per-record EXIF orientation (version 1 reads as upright); 3: each shard's sha256;
                     # 4: records FFR2 with the task's geometry (polygons, keypoints, oriented corners), the task
READABLE_VERSIONS = (1, 2, 3, 4)
MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"


def shard_file(index: int, pack_id: str | None = None) -> str:
    """Shard k's file name; in object storage with its pack's id, so a re-pack there writes new objects."""
    return f"shard-{pack_id}-{index:05d}.mdb" if pack_id else f"shard-{index:05d}.mdb"


def sha256_file(path, chunk: int = 8 << 20) -> str:
    """The hex sha256 of a file's bytes: a shard's content checksum, what the manifest records for each shard
    (format version 3) and what a download into the shard cache is checked against."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def record_key(local: int) -> bytes:
    """Key of the `local`-th record of a shard (global index minus the shard's start).

    Shard-relative, so shards can be written in parallel before their global offsets are known;
    big-endian, so LMDB's key order is record order and appends are cheap."""
    return local.to_bytes(8, "big")


def pack_lock_path(out) -> Path:
    """The lock file of a pack into store `out`: `.OUT.lock` beside it. A running `fastfeed pack` holds an exclusive
    flock on it (its pid inside) and removes it when done; a leftover nobody has locked means nothing."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


class FormatError(ValueError):
    """A store or record that this version of fastfeed cannot read."""


class RecordCorrupt(FormatError):
    """A record whose CRC or layout does not check out."""


class StoreChanged(FormatError):
    """A shard changed on disk (truncated, overwritten) while a Store was reading it."""


class NotAStore(FormatError):
    """`path`, given where a store belongs, is none (missing, a file, a folder without a manifest): the message says
    what it is and what to do (`local.not_a_store`; which dataset a folder is, the CLI asks `pack/layout`)."""

    def __init__(self, message: str, path):
        super().__init__(message)
        self.path = Path(path)


@dataclass(frozen=True)
class ShardInfo:
    file: str     # shard_file(k)
    count: int    # records in it
    bytes: int    # file size: a reader refuses a shard of another size (truncated or replaced)
    start: int    # global index of its first record
    sha256: str | None = None   # of the file's bytes (version 3; a download is checked against it)


@dataclass
class Manifest:
    """What a store holds (manifest.json; keys documented in docs/format.md). The nested dicts are
    `payload` {store, max_side, quality}, `source` {format, root, split, annotations, images_seen,
    fingerprint}, `stats` {class_boxes, sizes, record_bytes}, `report` {errors, notes, examples}."""

    num_images: int
    num_boxes: int
    num_crowd: int
    classes: list
    category_ids: list
    payload: dict
    shards: list                 # [ShardInfo]
    fingerprint: str             # of the content: records, classes and payload settings
    source: dict
    pack_options: dict
    stats: dict
    report: dict
    created: str
    fastfeed_version: str
    format_version: int = FORMAT_VERSION
    task: str = "detect"                 # what each record's geometry is: detect | segment | pose | obb (version 4)
    kpt_shape: list | None = None        # pose: [K, D], keypoints per object and values per keypoint (2 or 3)
    flip_idx: list | None = None         # pose: the keypoint each one becomes in a left-right flip (None: not given)

    @property
    def store_mode(self) -> str:
        """How pixels are stored: 'original' | 'jpeg' | 'raw'."""
        return self.payload["store"]

    @property
    def source_fingerprint(self) -> str:
        """Of the source the store was packed from: image and label files, annotation JSON."""
        return self.source["fingerprint"]

    def to_json(self) -> dict:
        d = {"format": FORMAT_NAME} | {f.name: getattr(self, f.name) for f in fields(self)}
        d["shards"] = [asdict(s) for s in self.shards]
        return d

    @classmethod
    def from_json(cls, d: dict, path) -> Manifest:
        try:
            kw = {f.name: d[f.name] for f in fields(cls) if f.name in d or f.default is MISSING}
            kw["shards"] = [ShardInfo(**s) for s in kw["shards"]]
            return cls(**kw)
        except (KeyError, TypeError) as e:
            raise FormatError(f"{path} lacks or mangles the manifest entry {e}; the store is damaged, "
                              "re-run `fastfeed pack`") from None


def write_manifest(path, manifest: Manifest) -> None:
    Path(path).write_bytes(manifest_bytes(manifest))


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=1) + "\n").encode("utf-8")


def read_manifest(path) -> Manifest:
    """Load and version-check a manifest (any of READABLE_VERSIONS); errors say what the file is and what to do."""
    try:
        return parse_manifest(Path(path).read_bytes(), path)
    except FileNotFoundError:
        raise FormatError(f"{path} not found: not a fastfeed store (create one with `fastfeed pack`)") from None


def parse_manifest(data: bytes, path) -> Manifest:
    """A manifest from its bytes (`path`: where it came from, for messages)."""
    try:
        m = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path} is not valid JSON ({e}); the store is damaged, re-run `fastfeed pack`") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise FormatError(f"{path} is not a fastfeed manifest")
    version = m.get("format_version")
    if version not in READABLE_VERSIONS:
        raise FormatError(f"store format version {version} but this fastfeed reads versions "
                          f"{', '.join(map(str, READABLE_VERSIONS))}: re-pack the dataset with this fastfeed, or use the "
                          "fastfeed release that wrote it")
    return Manifest.from_json(m, path)
