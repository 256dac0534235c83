"""A segment's files on disk, read without attaching: its users lock (`users_path`), the temporary files of its
builders (`temp_files`), and whether the segment itself is usable (`probe`). What attaching (`lease.py`) and
listing/reclaiming/clearing (`manage.py`) both read."""

from __future__ import annotations

import os
from pathlib import Path

from . import layout, users


def users_path(segment: Path) -> Path:
    return segment.with_name(segment.name + ".users")


def temp_files(segment: Path) -> list[tuple[Path, int]]:
    """(path, builder pid) of every temporary build file of `segment`."""
    out = []
    for p in segment.parent.glob(segment.name + ".tmp-*"):
        pid = p.name.rsplit("-", 1)[-1]
        out.append((p, int(pid) if pid.isdigit() else -1))
    return out


def probe(segment: Path, fingerprint: str | None = None, imgsz: int | None = None) -> tuple[layout.Header | None, str]:
    """(header, "") of a usable segment; (None, why not) otherwise; (None, "") when there is none."""
    try:
        with open(segment, "rb") as f:
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
