"""The README's Install: after the torch build for the machine, `pip install -e .` keeps it (a dry run, offline)."""

from __future__ import annotations

import torch
from install_checks import dry_run, readme_commands, torch_changes


def test_pip_install_e_dot_keeps_the_installed_torch(tmp_path):
    assert "| `pip install -e .` |" in readme_commands()
    installs = dry_run(".", tmp_path)
    assert ("fastfeed", "0.1.0") in installs                    # the dry run did resolve fastfeed
    assert torch_changes(installs) == [], f"pip would replace torch {torch.__version__}: {torch_changes(installs)}"


def test_every_message_naming_an_extra_gives_the_command_a_checkout_user_types():
    import re

    from install_checks import REPO

    extras = set(re.findall(r"^(\w+) = \[", (REPO / "pyproject.toml").read_text(), re.M))
    said = {}
    for path in sorted((REPO / "fastfeed").rglob("*.py")):
        text = path.read_text()
        assert "fastfeed[" not in text, f"{path}: names an extra as `fastfeed[...]`, not `pip install -e '.[...]'`"
        for m in re.finditer(r"pip install[^\n\"]*?\[([\w,<>{}().]+)\]", text):
            assert m.group(0).startswith("pip install -e '.["), f"{path}: {m.group(0)!r}"
            said[m.group(1)] = path
    named = {n for k in said for n in k.split(",") if n.isidentifier()}
    assert {"dali", "heic", "raw", "plot", "npu", "ultralytics"} <= named <= extras, (named, extras)
    assert "pip install -e '.[NAME]'" in readme_commands()
    assert ("| CPU + Ultralytics, the CPU index unreachable (`No matching distribution found for cuda-bindings<14,>=13.0.3`"
            in readme_commands() and "(the pair from the default index: CUDA builds, which run on a CPU too, with ~3 GB"
            in readme_commands())
