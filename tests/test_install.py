"""The README's Install: after the torch build for the machine, `pip install -e .` keeps it (a dry run, offline)."""

from __future__ import annotations

import torch
from install_checks import dry_run, readme_commands, torch_changes


def test_pip_install_e_dot_keeps_the_installed_torch(tmp_path):
    assert "| `pip install -e .` |" in readme_commands()
    installs = dry_run(".", tmp_path)
    assert ("fastfeed", "0.1.0") in installs                    # the dry run did resolve fastfeed
    assert torch_changes(installs) == [], f"pip would replace torch {torch.__version__}: {torch_changes(installs)}"
