"""fastfeed bench: bad input, missing optional dependencies, loaders that cannot run."""

from __future__ import annotations

import importlib.util
import json

import pytest
from bench_helpers import FAST, bench, fake_loaders, store  # noqa: F401  (fixtures)

from fastfeed.bench import BenchConfig
from fastfeed.cli import main
from fastfeed.loaders import Loader, list_loaders

# --- bad input and missing loaders ----------------------------------------------------------------

def test_unknown_loader_lists_the_valid_ones(store, capsys):
    assert main(["bench", "--data", str(store), "--loader", "cpu", "--loader", "nope", *FAST]) == 2
    err = capsys.readouterr().err
    assert "unknown loader 'nope'" in err and "valid loaders: " + ", ".join(list_loaders()) in err


def test_a_path_that_is_not_a_store(tmp_path, capsys):
    assert main(["bench", "--data", str(tmp_path), *FAST]) == 1
    assert "not a fastfeed store" in capsys.readouterr().err
    assert main(["bench", "--data", str(tmp_path / "missing"), *FAST]) == 1
    assert "not a fastfeed store" in capsys.readouterr().err


class _FailsOnIter(Loader):
    """A loader that builds but fails at its first batch (as a lazily-initialised DALI pipeline may)."""

    def __init__(self, exc):
        self.exc = exc

    def iter_batches(self):
        raise self.exc

    def __len__(self):
        return 8

    def set_epoch(self, epoch):
        pass

    def close(self):
        pass


def test_missing_optional_dependency_is_reported_and_the_others_run(store, tmp_path, capsys, fake_loaders):
    def missing(store, cfg):
        raise ImportError("needs fakepkg: pip install fastfeed[fake]")

    no_dep = fake_loaders(missing)
    lazy = fake_loaders(lambda store, cfg: _FailsOnIter(ImportError("fakepkg is not installed")))
    broken = fake_loaders(lambda store, cfg: _FailsOnIter(RuntimeError("boom")))
    out = tmp_path / "b.json"
    assert main(["bench", "--data", str(store), "--loader", no_dep, "--loader", "cpu", "--loader", lazy,
                 "--loader", broken, "--workers", "1", "--seconds", "0.5", "--json", str(out), *FAST]) == 0
    table = capsys.readouterr().out
    assert f"{no_dep}" in table and "unavailable: needs fakepkg: pip install fastfeed[fake]" in table
    assert "unavailable: fakepkg is not installed" in table and "failed: RuntimeError: boom" in table
    d = json.loads(out.read_text())
    rows = {r["name"]: r for r in d["results"]}
    assert [r["name"] for r in d["results"]] == [no_dep, "cpu", lazy, broken]
    assert rows[no_dep]["status"] == "unavailable" and rows[no_dep]["images_per_s"] is None
    assert rows[lazy]["status"] == "unavailable" and rows[broken]["status"] == "failed"
    assert rows["cpu"]["status"] == "ok" and rows["cpu"]["images_per_s"]["overall"] > 0
    assert d["baseline"] == "cpu" and d["fastest"] == "cpu"   # ratios against the first loader that ran


def test_a_worker_that_raises_is_one_line_naming_its_cause(store, tmp_path, capsys, caplog):
    import shutil

    from store_helpers import flip_byte_in_record

    bad = tmp_path / "bad.ff"
    shutil.copytree(store, bad)
    flip_byte_in_record(bad, 5)
    assert main(["bench", "--data", str(bad), "--loader", "cpu", "--workers", "1", "--seconds", "5", *FAST]) == 1   # nothing measured
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cpu "))
    assert "failed: WorkerError: loader worker 0 failed on batch" in row and "CRC32 mismatch" in row
    warned = [r.getMessage() for r in caplog.records if "loader cpu failed" in r.getMessage()]
    assert len(warned) == 1 and "record 5 in shard shard-00000.mdb: CRC32 mismatch" in warned[0]
    assert "\n" not in warned[0] and "Traceback" not in warned[0]


def test_all_loaders_unavailable_exits_1(store, capsys, fake_loaders):
    def missing(store, cfg):
        raise ImportError("needs fakepkg")

    assert main(["bench", "--data", str(store), "--loader", fake_loaders(missing), *FAST]) == 1
    assert "unavailable: needs fakepkg" in capsys.readouterr().out


def test_loader_all_expands_to_the_registry(store):
    assert BenchConfig(data=store, loaders=("all", "cpu")).resolved_loaders() == list_loaders()


@pytest.mark.parametrize("kw, match", [
    ({"imgsz": 100}, "--imgsz must be a positive multiple of 32"),
    ({"batch_size": 0}, "--batch must be >= 1"),
    ({"seed": -1}, "--seed must be an integer >= 0"),
    ({"workers": -1}, "--workers must be an integer >= 0"),
    ({"workers": "many"}, "or 'auto'"),
    ({"seconds": 0}, "--seconds must be > 0"),
    ({"warmup": -1}, "--warmup must be >= 0"),
    ({"device": "tpu"}, "--device must be one of cpu, cuda, npu"),
    ({"step_ms": -1}, "--step-ms must be >= 0"),
    ({"seconds": float("inf")}, "--seconds must be > 0 and at most 86400 \\(a day\\), got inf"),   # was a run that
    ({"seconds": 1e300}, "--seconds must be > 0 and at most 86400 \\(a day\\), got 1e\\+300"),     # never ended
    ({"step_ms": float("inf")}, r"--step-ms must be >= 0 and at most 60000 \(a minute\), got inf"),   # was an OverflowError
    ({"step_ms": 1e300}, "--step-ms must be >= 0 and at most 60000"),   # one step that never ended
    ({"step_ms": 5, "model": "yolov3"}, "exclude each other"),
    ({"model": "yolov5"}, "--model must be one of yolov3, yolov3-tiny"),
])
def test_bad_values_name_the_flag(kw, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(data=".", **kw)


def test_cli_usage_errors(store, tmp_path, capsys, monkeypatch):
    for bad in ("lots", "-1"):
        with pytest.raises(SystemExit) as e:
            main(["bench", "--data", str(store), "--workers", bad])
        assert e.value.code == 2
        assert f"--workers: expected an integer >= 0 or 'auto', got '{bad}'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["bench", "--data", str(store), "--step-ms", "5", "--model", "yolov3"])
    assert e.value.code == 2
    # was: measured for ever (here, on the old code: the --json folder's error)
    assert main(["bench", "--data", str(store), "--seconds", "1e300", "--json", str(store.parent), "--quiet"]) == 2
    assert "--seconds must be > 0 and at most 86400 (a day), got 1e+300" in capsys.readouterr().err
    assert main(["bench", "--data", str(store), "--batch", "32", "--quiet"]) == 2
    assert "--batch 32 is larger than the store (16 images)" in capsys.readouterr().err
    # the outputs' names checked before the measuring, not after it (a folder, a file type matplotlib cannot write)
    assert main(["bench", "--data", str(store), "--json", str(store.parent), "--quiet"]) == 2
    assert f"--json {store.parent} is a folder: name a file" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")   # was a traceback after the measuring (FileExistsError, Errno 30)
    quick = ["--seconds", "0.5", "--imgsz", "64", "--quiet"]
    assert main(["bench", "--data", str(store), "--json", str(tmp_path / "afile" / "b.json"), *quick]) == 2
    assert f"{tmp_path / 'afile'} is a file, not a folder: name a file in a writable folder" in capsys.readouterr().err
    monkeypatch.setattr("fastfeed.cli.bench.os.access", lambda path, mode: False)   # as a read-only mount
    assert main(["bench", "--data", str(store), "--json", str(tmp_path / "b.json"), *quick]) == 2
    assert f"--json {tmp_path / 'b.json'}: {tmp_path} is read-only here" in capsys.readouterr().err
    monkeypatch.undo()
    if importlib.util.find_spec("matplotlib") is not None:
        assert main(["bench", "--data", str(store), "--plot", str(store.parent / "x.txt"), "--quiet"]) == 2
        assert "--plot" in capsys.readouterr().err and not (store.parent / "x.txt").exists()


def test_cuda_without_a_gpu_says_so(store, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["bench", "--data", str(store), "--device", "cuda", *FAST]) == 1
    assert "sees no CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_copy_stage_is_timed(store):
    r = bench(store, device="cuda", seconds=1.0).results[0]
    assert r.ok and r.copy_applicable and r.stage_ms_per_sample["copy"] > 0 and r.stall.copy_s > 0


def test_the_default_batch_fits_a_small_store_and_a_batch_given_never_changes(yolo_builder, tmp_path, capsys):
    from store_helpers import run_pack

    b = yolo_builder(names=["a"])
    for k in range(6):
        b.add(f"i{k}", ["0 0.5 0.5 0.3 0.4"], seed=k)
    small = tmp_path / "six.ff"
    run_pack(b.root, small)
    run = ["bench", "--data", str(small), "--loader", "cpu", "--workers", "0", "--seconds", "0.3", "--imgsz", "64"]
    assert main(run) == 0   # was: "--batch 16 is larger than the store (6 images)", a 16 the user never asked for
    out, err = capsys.readouterr()
    assert "fastfeed: warning: --batch 6, the store's size: the default 16 is larger than the store" in err
    assert "batch 6 " in out and "larger than the store (" not in err
    assert main([*run, "--batch", "16", "--quiet"]) == 2   # the same 16, given: refused, not cut
    assert "--batch 16 is larger than the store (6 images); use --batch 6 or less" in capsys.readouterr().err
