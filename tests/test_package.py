"""Rules of the package's shape that the design (docs/design.md) depends on, checked on the source."""

from __future__ import annotations

import re
from pathlib import Path

import fastfeed

PKG = Path(fastfeed.__file__).parent


def _modules():
    return [p for p in PKG.rglob("*.py") if "sample_data" not in p.parts]


def test_no_module_over_300_lines():
    long = {str(p.relative_to(PKG)): n for p in _modules() if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"split these modules (the house limit is 300 lines): {long}"


def test_only_store_parses_records_and_only_cli_prints():
    for p in _modules():
        rel = p.relative_to(PKG)
        text = p.read_text()
        if rel.parts[0] != "store":
            assert not re.search(r"parse_record|decode_record|raw_record|record\[\d+:\d+\]", text), \
                f"{rel} reads record bytes itself (use Store.record / Record.decode)"
        if rel.parts[0] != "cli":
            assert not re.search(r"^\s*print\(", text, re.M), f"{rel} prints (only fastfeed/cli may)"


def test_one_device_module():
    for p in _modules():
        rel = p.relative_to(PKG)
        if rel.name == "devices.py":
            continue
        text = p.read_text()
        assert "import torch_npu" not in text, f"{rel} imports torch_npu itself (fastfeed.devices does)"
        code = "\n".join(line.split("#")[0] for line in text.splitlines())   # what runs, not what comments say
        assert not re.search(r"torch\.cuda\.", code), f"{rel} calls torch.cuda itself (fastfeed.devices does)"
        assert not re.search(r"getattr\(torch,", code), f"{rel} looks up the accelerator module itself (fastfeed.devices does)"
        assert "sched_getaffinity" not in text or rel.name == "procs.py", f"{rel} counts cores itself"


def test_tests_share_helpers_through_helper_modules():
    """A test module never imports from another test module: shared helpers live in conftest.py or a helper
    module (store_helpers, loader_checks, ...), so a test file can move or split without breaking others."""
    tests = Path(__file__).parent
    for p in tests.rglob("*.py"):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            assert not re.match(r"\s*(from test_\w+ import|import test_\w+)", line), \
                f"{p.relative_to(tests)}:{n} imports a test module: {line.strip()}"


def test_the_prefetcher_and_the_loader_contract_import_on_a_bare_gpu_machine():
    """A bare GPU machine has torch, numpy, OpenCV and little else (no LMDB, simplejpeg, orjson, pycocotools):
    the prefetcher, the Loader ABC, the devices and the device augmentation must import there
    (benchmarks/gpu_check.sh runs on one)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('lmdb', 'simplejpeg', 'orjson', 'pycocotools'):\n"
        "            raise ModuleNotFoundError(f'no module named {name!r} (blocked by the test)')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import fastfeed.prefetch, fastfeed.loaders, fastfeed.devices, fastfeed.batch, fastfeed.device_augment\n"
        "from fastfeed.loaders import Loader, LoaderConfig, WorkerError\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
