"""What a path given where a store belongs is instead, and what to do: `Store(path)` asks here when `path` has no
manifest, so every command (train, bench, inspect, verify, cache) says the same thing."""

from __future__ import annotations

from pathlib import Path

from .format import MANIFEST, FormatError

_PACK = "create one with `fastfeed pack SRC -o OUT`"


def not_a_store(path: Path) -> FormatError | None:
    """The error for a `path` without a manifest: missing, a file (a data.yaml: pack it), a COCO/YOLO dataset folder
    (pack it). None for a folder that is none of these (the manifest's own "not found" then says so)."""
    if not path.exists():
        return FormatError(f"{path} does not exist: not a fastfeed store ({_PACK})")
    if path.is_file():
        if path.suffix.lower() in (".yaml", ".yml"):
            return FormatError(f"{path} is a dataset file (Ultralytics' data.yaml), not a fastfeed store: pack it with "
                               f"`fastfeed pack {path} -o train.ff` (`--split val -o val.ff` for its val split), "
                               "then pass the .ff folder")
        return FormatError(f"{path} is a file, not a fastfeed store (a folder with {MANIFEST}; {_PACK})")
    if not path.is_dir():
        return FormatError(f"{path} is not a folder: not a fastfeed store ({_PACK})")
    kind = _dataset_kind(path)
    if kind is not None:
        name = path.resolve().name or "data"
        if kind == "two":
            return FormatError(f"{path} is a dataset folder with both a COCO JSON and YOLO labels, not a fastfeed "
                               f"store: pack it with `fastfeed pack {path} -o {name}.ff --format coco` (or "
                               "`--format yolo`), then pass the .ff folder")
        return FormatError(f"{path} is a {kind} dataset, not a fastfeed store: pack it with "
                           f"`fastfeed pack {path} -o {name}.ff`, then pass the .ff folder")
    return None


def _dataset_kind(path: Path) -> str | None:
    """'COCO' / 'YOLO' when `path` is a source `fastfeed pack` reads (its own layout rule), 'two' when it holds
    both layouts (pack then asks for --format), else None."""
    from ..pack.layout import TwoLayouts, detect_format  # only on this error path: reading needs no packing code

    try:
        return detect_format(path).upper()
    except TwoLayouts:
        return "two"
    except Exception:   # not a layout pack knows (or an unreadable folder): then it is no dataset either
        return None
