"""What a path given where a store belongs is instead, and what to do: `Store(path)` asks here when `path` has no
manifest, so every command (train, bench, inspect, verify) says the same thing. Which dataset a folder is, the store
does not know: the CLI asks `pack/layout` about a `NotAStore` folder (`cli.common.fail`)."""

from __future__ import annotations

from pathlib import Path

from .format import MANIFEST, FormatError

_PACK = "create one with `fastfeed pack SRC -o OUT`"


class NotAStore(FormatError):
    """`path`, given where a store belongs, is none (missing, a file, a folder without a manifest): the message
    says what it is and what to do."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = Path(path)


def not_a_store(path: Path) -> NotAStore:
    """The error for a `path` without a manifest: missing, a file (a data.yaml: pack it), a folder."""
    if not path.exists():
        return NotAStore(f"{path} does not exist: not a fastfeed store ({_PACK})", path)
    if path.is_file():
        if path.suffix.lower() in (".yaml", ".yml"):
            return NotAStore(f"{path} is a dataset file (Ultralytics' data.yaml), not a fastfeed store: pack it with "
                             f"`fastfeed pack {path} -o train.ff` (`--split val -o val.ff` for its val split), "
                             "then pass the .ff folder", path)
        return NotAStore(f"{path} is a file, not a fastfeed store (a folder with {MANIFEST}; {_PACK})", path)
    if not path.is_dir():
        return NotAStore(f"{path} is not a folder: not a fastfeed store ({_PACK})", path)
    return NotAStore(f"{path / MANIFEST} not found: not a fastfeed store ({_PACK})", path)
