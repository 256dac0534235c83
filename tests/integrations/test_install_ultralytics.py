"""The README's Install with Ultralytics: with torch and torchvision installed as a pair (this venv: 2.14.1 +
0.29.1), `pip install -e '.[ultralytics]'` keeps both and brings no nvidia-* wheels (a dry run, offline)."""

from __future__ import annotations

import pytest
import torch
from install_checks import dry_run, readme_commands, torch_changes

torchvision = pytest.importorskip("torchvision")


def test_pip_install_the_ultralytics_extra_keeps_the_torch_pair(tmp_path):
    assert "| `pip install -e '.[ultralytics]'` |" in readme_commands()
    installs = dry_run(".[ultralytics]", tmp_path)
    assert ("fastfeed", "0.1.0") in installs
    assert torch_changes(installs) == [], (f"pip would replace torch {torch.__version__} / torchvision "
                                           f"{torchvision.__version__}: {torch_changes(installs)}")
