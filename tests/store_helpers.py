"""Packing and store-editing helpers the tests share (pack a source, read rejects, damage or rewrite a record)."""

from __future__ import annotations

import json

from fastfeed import Store
from fastfeed.pack import PackConfig, pack


def run_pack(src, out, **kw):
    kw.setdefault("workers", 1)
    kw.setdefault("progress", False)
    kw.setdefault("max_dropped", 1.0)   # a fixture of a few images, each a case: one reject is no share of a split
    return pack(PackConfig(src=src, out=out, **kw))


def rejects(out):
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def by_name(store):
    return {store[i].file_name: store[i] for i in range(len(store))}


def flip_byte_in_record(store_dir, index):
    """Damage one byte of record `index`'s payload (its CRC left as it was), written through LMDB at the
    record's own key: no search of the shard's bytes, so it does not depend on the layout a pack produced
    (a needle searched in the file was not always unique: similar small images, pages LMDB left behind).
    The manifest's shard size follows the file, so the damage reads as a CRC mismatch, not a changed store."""
    import dataclasses

    import lmdb

    from fastfeed.store import format as fmt

    store = Store(store_dir)
    shard_no = store.shard_of(index)
    local = index - store.shards[shard_no].start
    name = store.shard_name(index)
    store.close()
    shard = store_dir / name
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        rec = bytearray(txn.get(fmt.record_key(local)))
        rec[len(rec) - 1 - len(rec) // 8] ^= 0x5A   # inside the payload, which ends the record
        txn.put(fmt.record_key(local), bytes(rec))
    env.close()
    manifest = fmt.read_manifest(store_dir / fmt.MANIFEST)
    manifest.shards[shard_no] = dataclasses.replace(manifest.shards[shard_no], bytes=shard.stat().st_size)
    fmt.write_manifest(store_dir / fmt.MANIFEST, manifest)
    return name


def replace_record(store_dir, index, orientation=None, **changes):
    """Rewrite record `index` in place with some fields changed (CRC recomputed, manifest sizes fixed);
    orientation=0 writes what format version 1 wrote there."""
    import dataclasses
    import struct

    import lmdb

    from fastfeed.store import format as fmt
    from fastfeed.store.record import crc32, encode_record

    store = Store(store_dir)
    r = store.record(index)
    shard_no = store.shard_of(index)
    local = index - store.shards[shard_no].start
    fields = dict(codec=r.codec, height=r.height, width=r.width, orig_height=r.orig_height, orig_width=r.orig_width,
                  image_id=r.image_id, file_name=r.file_name, boxes=r.boxes, classes=r.classes,
                  crowd_boxes=r.crowd_boxes, crowd_classes=r.crowd_classes, payload=bytes(r.payload),
                  orientation=r.orientation if orientation in (None, 0) else orientation, task=r.task,
                  geometry=r.geometry) | changes
    store.close()
    rec = bytearray(encode_record(**fields))
    if orientation == 0:
        struct.pack_into("<H", rec, 10, 0)
        struct.pack_into("<I", rec, 4, crc32(memoryview(rec)[8:]))
    shard = store_dir / fmt.shard_file(shard_no)
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(fmt.record_key(local), bytes(rec))
    env.close()
    manifest = fmt.read_manifest(store_dir / fmt.MANIFEST)
    manifest.shards[shard_no] = dataclasses.replace(manifest.shards[shard_no], bytes=shard.stat().st_size)
    fmt.write_manifest(store_dir / fmt.MANIFEST, manifest)
