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


def _imports_of(path: Path) -> set[str]:
    """The fastfeed modules `path` imports, at the top and inside functions alike (relative imports resolved)."""
    import ast

    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    package = parts if rel.name == "__init__" else parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fastfeed")}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if mod.startswith("fastfeed"):
                found.add(mod)
                found |= {f"{mod}.{a.name}" for a in node.names}   # `from . import format`: a module too
    return found


def _module_graph() -> dict[str, set[str]]:
    names = {}
    for p in _modules():
        rel = p.relative_to(PKG.parent).with_suffix("")
        names[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = p
    return {m: {i for i in _imports_of(p) if i in names and i != m} for m, p in names.items()}


def test_no_import_circle_in_the_package():
    """Modules import one another one way only (top-level and in-function imports alike), the store's included: a
    circle there is what made `Store` a switch over its subclasses; a function-level import that closes a circle
    only hides it."""
    graph = _module_graph()

    def parent(m):   # importing a.b.c runs a/__init__ and a/b/__init__ first: not an edge we draw
        return m.rsplit(".", 1)[0]

    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if n == parent(m) or m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_store_never_imports_the_loaders():
    """The store exposes facts (shard sizes, the cache's limit, whether reads are remote); the loaders choose the
    order (docs/design.md): nothing in fastfeed/store imports fastfeed.loaders, not even inside a function; nor
    fastfeed.pack (which dataset a folder is, the CLI asks pack/layout: no arrow runs back up)."""
    for m, deps in _module_graph().items():
        if m.startswith("fastfeed.store"):
            bad = sorted(d for d in deps if d.startswith(("fastfeed.loaders", "fastfeed.pack")))
            assert not bad, f"{m} imports {bad}: the store must not choose an order nor know datasets"


def test_the_prefetcher_never_imports_the_loaders():
    """The device loader's feed builds on the prefetcher; the prefetcher knows a fastfeed loader only by the
    `batch.BatchFeed` it implements: nothing in fastfeed/prefetch imports fastfeed.loaders (the arrow runs one way)."""
    for m, deps in _module_graph().items():
        if m.startswith("fastfeed.prefetch"):
            bad = sorted(d for d in deps if d.startswith("fastfeed.loaders"))
            assert not bad, f"{m} imports {bad}: ask isinstance(x, batch.BatchFeed) instead"


def test_the_import_rules_see_a_circle_and_a_loader_import(tmp_path, monkeypatch):
    """The two rules above are not vacuous: a store module importing the loaders inside a function is found."""
    fake = tmp_path / "fastfeed" / "store"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("def f():\n    from ..loaders.sampler import default_order\n    from . import b\n")
    (fake / "b.py").write_text("from .a import f\n")
    monkeypatch.setattr(__import__(__name__), "PKG", tmp_path / "fastfeed")
    deps = _imports_of(fake / "a.py")
    assert "fastfeed.loaders.sampler" in deps and "fastfeed.store.b" in deps
    assert "fastfeed.store.a" in _imports_of(fake / "b.py")


def _thread_names() -> dict[str, list[str]]:
    """Every thread name (or thread-pool prefix) the package starts, as written: {name: [module, ...]}."""
    import ast

    names: dict[str, list[str]] = {}
    for p in _modules():
        tree = ast.parse(p.read_text())
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            key = {"Thread": "name", "ThreadPoolExecutor": "thread_name_prefix"}.get(func)
            if key is None:
                continue
            kw = next((k.value for k in node.keywords if k.arg == key), None)
            name = kw.value if isinstance(kw, ast.Constant) else consts.get(kw.id) if isinstance(kw, ast.Name) else None
            names.setdefault(str(name), []).append(f"{p.relative_to(PKG)}:{node.lineno}")
    return names


def test_every_thread_the_package_starts_has_its_own_descriptive_name():
    """A thread dump (py-spy, faulthandler) names what each thread does: every thread fastfeed starts is named
    fastfeed-<what>, and no two kinds share a name (the device prefetcher's and the shard read-ahead's were both
    fastfeed-prefetch). docs/design.md, "Vocabulary", lists them."""
    names = _thread_names()
    assert "None" not in names, f"threads started without a name (Thread-N in a dump): {names.get('None')}"
    bad = {n: where for n, where in names.items() if not re.fullmatch(r"fastfeed-[a-z0-9-]+", n)}
    assert not bad, f"thread names not of the form fastfeed-<what>: {bad}"
    shared = {n: where for n, where in names.items() if len(where) > 1}
    assert not shared, f"one thread name started in several places: {shared}"
    assert {"fastfeed-device-prefetch", "fastfeed-read-ahead", "fastfeed-read-ahead-shard"} <= names.keys()
