"""A slab's files on disk, read without attaching: its users lock (`users_path`), the temporary files of its
builders (`temp_files`), and whether the slab itself is usable (`probe`). What attaching (`lease.py`) and
listing/reclaiming/clearing (`manage.py`) both read."""

from __future__ import annotations

import os
from pathlib import Path

from . import layout, users


def users_path(slab: Path) -> Path:
    return slab.with_name(slab.name + ".users")


def temp_files(slab: Path) -> list[tuple[Path, int]]:
    """(path, builder pid) of every temporary build file of `slab`."""
    out = []
    for p in slab.parent.glob(slab.name + ".tmp-*"):
        pid = p.name.rsplit("-", 1)[-1]
        out.append((p, int(pid) if pid.isdigit() else -1))
    return out


def probe(slab: Path, fingerprint: str | None = None, imgsz: int | None = None) -> tuple[layout.Header | None, str]:
    """(header, "") of a usable slab; (None, why not) otherwise; (None, "") when there is none."""
    try:
        with open(slab, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(layout.HEADER.size)
    except FileNotFoundError:
        return None, ""
    try:
        h = layout.read_header(head)
    except layout.CacheFormatError as e:
        return None, str(e)
    if h.state != layout.STATE_COMPLETE:
        who = "alive" if users.alive(h.builder_pid) else "dead"
        return None, f"half-written (state {h.state}, builder pid {h.builder_pid}, {who})"
    if size != h.total_bytes:
        return None, f"{size} bytes, the header says {h.total_bytes}: truncated or overwritten"
    if fingerprint is not None and h.fingerprint != fingerprint:
        return None, f"holds store {h.fingerprint}, not {fingerprint}"
    if imgsz is not None and h.imgsz != imgsz:
        return None, f"built for imgsz {h.imgsz}, not {imgsz}"
    return h, ""
