"""A shard file's content checksum: what the manifest records for each shard (format version 3) and what a
download into the shard cache is checked against."""

from __future__ import annotations

import hashlib


def sha256_file(path, chunk: int = 8 << 20) -> str:
    """The hex sha256 of a file's bytes (a shard's content checksum in the manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
