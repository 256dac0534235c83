"""What `pip install` would do to this environment, from a dry run (`pip install --dry-run --report`), offline:
`--no-index` (pip resolves from what is installed, and fails rather than fetch anything) and
`--no-build-isolation` (fastfeed's build backend, setuptools, is the one installed: torch depends on it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_STACK = re.compile(r"(torch|torchvision|nvidia-.*|triton|cuda-.*)")   # what a torch swap brings along


def readme_commands() -> str:
    """The README's Install section (the commands the tests dry-run must be the ones it names)."""
    text = (REPO / "README.md").read_text()
    return text[text.index("## Install"):text.index("## Pack a dataset")]


def dry_run(requirement: str, tmp_path: Path) -> list[tuple[str, str]]:
    """(name, version) of each distribution `pip install -e <requirement>` would install or replace here."""
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
                        "--no-build-isolation", "--report", str(report), "-e", requirement],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"pip cannot install {requirement} from what is installed here:\n{r.stderr[-2000:]}"
    return [(i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in json.loads(report.read_text())["install"]]


def torch_changes(installs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, v) for n, v in installs if TORCH_STACK.fullmatch(n.replace("_", "-"))]
