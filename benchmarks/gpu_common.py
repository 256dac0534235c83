"""What every gpu_check section shares: the table rows, the failures, and running a section safely."""

from __future__ import annotations

import time
import traceback

import torch

ROWS: list[tuple[str, str, str]] = []      # (section, item, value): the table printed last
FAILURES: list[str] = []


def row(section: str, item: str, value: str) -> None:
    ROWS.append((section, item, value))
    print(f"  {section:<8} {item:<34} {value}", flush=True)


def section(name: str, fn, *args, deadline: float):
    """Run one section; a missing optional piece is the section's own business (it adds a row)."""
    if time.monotonic() > deadline:
        row(name, "(skipped)", "out of time")
        return None
    print(f"--- {name}", flush=True)
    try:
        return fn(*args)
    except Exception as e:  # a real failure: reported, the other sections still run
        traceback.print_exc()
        FAILURES.append(f"{name}: {type(e).__name__}: {e}")
        row(name, "(failed)", f"{type(e).__name__}: {str(e)[:60]}")
        return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
