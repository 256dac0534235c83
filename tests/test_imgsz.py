"""One rule for imgsz, said the same way by every command and config that takes one (fastfeed/checks.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fastfeed.bench.config import BenchConfig
from fastfeed.checks import check_imgsz, imgsz_error
from fastfeed.cli import main
from fastfeed.loaders import LoaderConfig
from fastfeed.train import TrainConfig

RULE = "must be a positive multiple of 32 (the largest stride of the YOLO models), got 300: use 288 or 320"
REPO = Path(__file__).resolve().parents[1]


def test_the_rule_and_its_suggestions():
    assert check_imgsz(320) == 320 and imgsz_error(640) is None
    assert imgsz_error(300) == f"--imgsz {RULE}"
    assert imgsz_error(20).endswith("got 20: use 32")
    assert imgsz_error(True) is not None and imgsz_error(320.0) is not None and imgsz_error("320") is not None
    for make in (lambda: LoaderConfig(imgsz=300), lambda: TrainConfig(data="x", imgsz=300),
                 lambda: BenchConfig(data="x", imgsz=300)):
        with pytest.raises(ValueError, match=RULE.replace("(", r"\(").replace(")", r"\)")):
            make()


def test_every_command_says_the_same(tmp_path, capsys):
    for args in (["train", "--data", str(tmp_path), "--imgsz", "300"], ["bench", "--data", str(tmp_path), "--imgsz", "300"],
                 ["cache", "build", str(tmp_path), "--imgsz", "300"]):
        assert main(args) == 2, args
        assert RULE in capsys.readouterr().err, args


@pytest.mark.slow   # ~6 s: subprocesses
def test_show_batch_says_it_instead_of_a_traceback(tmp_path):
    assert main(["pack", "-o", str(tmp_path / "s.ff"), "--quiet", "--workers", "1"]) == 0
    run = subprocess.run([sys.executable, str(REPO / "tools" / "show_batch.py"), "--data", str(tmp_path / "s.ff"), "-o",
                          str(tmp_path / "b.png"), "--imgsz", "300"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and RULE in run.stderr and "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, str(REPO / "tools" / "show_batch.py"), "--data", str(tmp_path / "s.ff"), "-o",
                          str(tmp_path / "b.png"), "--imgsz", "96", "--batch", "4"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and (tmp_path / "b.png").is_file(), run.stderr
