"""fastfeed bench's headline: the rate over the whole timed window ranks, a bursty figure says so, the table ends
with a verdict only where a step was given, and progress in a log file is plain lines.

The loaders here run on a clock the test moves (bench_helpers.clock, paced): every figure follows from how they
are built, not from how busy the machine is.
"""

from __future__ import annotations

import json
import sys

import pytest
from bench_helpers import FAST, clock, fake_loaders, paced, store  # noqa: F401  (fixtures)

from fastfeed.bench.measure import rate_stats
from fastfeed.bench.result import doubt
from fastfeed.cli import main

STEADY = 1 / 64   # s per batch of 2: 128 images/s (a power of two: the clock adds it without rounding)


def bursty(k: int) -> float:
    """A second's wait, then 31 batches at once (0.5 ms each): about 63 images/s over a window, ~200 in its best
    slice and thousands between two batches of a burst."""
    return 1.0 if k % 32 == 0 else 0.0005


def _line(table: str, name: str) -> str:
    return next(x for x in table.splitlines() if x.startswith(name + " ") or x == name)


# --- the rate and its spread --------------------------------------------------------------------------------

def test_a_steady_rate_is_its_slices():
    ends = [0.1 * k + 0.05 for k in range(20)]           # a batch of 4 every 0.1 s over 2 s
    r = rate_stats(0.0, ends, [4] * 20, 2.0)
    assert r.overall == pytest.approx(40) and len(r.slices) == 4 and r.slice_s == pytest.approx(0.5)
    assert r.slices == pytest.approx([40] * 4) and r.spread == pytest.approx(0) and r.empty_slices == 0
    assert doubt(r, 20) is None


def test_a_burst_is_the_overall_rate_with_empty_slices():
    ends = [1.9 + 0.004 * k for k in range(20)]         # the same 80 images, all in the last 0.1 s
    r = rate_stats(0.0, ends, [4] * 20, 2.0)
    assert r.overall == pytest.approx(40)              # what a training run would get from it
    assert r.slices == pytest.approx([0, 0, 0, 160]) and r.empty_slices == 3 and r.slice_median == 0
    assert sum(r.slices) / len(r.slices) == pytest.approx(r.overall)
    assert doubt(r, 20).startswith("bursty delivery: 3 of 4 equal slices of the 2.0 s window got no batch")
    assert doubt(r, 4).startswith("only 4 timed batch(es)")


def test_a_wide_spread_is_named():
    ends = [0.025 * k + 0.0125 for k in range(40)] + [1.0 + 0.1 * k + 0.05 for k in range(10)]   # fast, then slow
    r = rate_stats(0.0, ends, [2] * 50, 2.0)
    assert r.overall == pytest.approx(50) and r.slices == pytest.approx([80] * 5 + [20] * 5)
    assert r.empty_slices == 0 and r.spread == pytest.approx(0.6)
    assert doubt(r, 50).startswith(f"spread ±{100 * r.spread:.0f}%: the rate changed a lot across the window")


# --- the table --------------------------------------------------------------------------------------------

def test_a_bursty_loader_ranks_by_its_real_rate(store, tmp_path, capsys, clock, fake_loaders):  # noqa: F811
    burst = fake_loaders(paced(clock, bursty))
    steady = fake_loaders(paced(clock, lambda k: STEADY))
    out = tmp_path / "b.json"
    assert main(["bench", "--data", str(store), "--loader", burst, "--loader", steady, "--seconds", "3",
                 "--json", str(out), *FAST]) == 0
    table = capsys.readouterr().out
    d = json.loads(out.read_text())
    b, s = ({r["name"]: r for r in d["results"]}[n] for n in (burst, steady))
    ib, is_ = b["images_per_s"], s["images_per_s"]
    # 95 batches of 2 in 3.046 s of the clock the loaders moved (30 + 32 + 32 + 1 after the warm-up); the steady
    # one 128 images/s.
    assert ib["overall"] == pytest.approx(190 / 3.046) and is_["overall"] == pytest.approx(128)
    # Its best moments beat the steady loader: anything but the whole window would have crowned it.
    assert ib["slice_max"] > is_["overall"] > ib["overall"]
    assert d["fastest"] == steady and d["baseline"] == burst
    assert s["ratio"] == pytest.approx(is_["overall"] / ib["overall"]) and b["ratio"] == 1.0
    assert ib["empty_slices"] == 6 and b["unreliable"].startswith("bursty delivery: 6 of 10 equal slices")
    assert s["unreliable"] is None and is_["empty_slices"] == 0

    row_b, row_s = _line(table, burst), _line(table, steady)
    assert f"{ib['overall']:.0f} ±" in row_b and " !" in row_b and "*" not in row_b and "1.00x" in row_b
    assert row_s.startswith(f"{steady} *") and f"{s['ratio']:.2f}x" in row_s and "!" not in row_s
    assert f"  ! {burst}: unreliable: bursty delivery: 6 of 10 equal slices of the 3.0 s window got no batch" in table
    assert "images/s: the images of the whole timed window / its length: what ranks, and vs" in table
    assert "median" not in table


def test_without_a_step_the_table_says_it_gives_no_verdict(store, capsys, clock, fake_loaders):  # noqa: F811
    steady = fake_loaders(paced(clock, lambda k: STEADY))
    assert main(["bench", "--data", str(store), "--loader", steady, "--seconds", "1", *FAST]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("no verdict for your training: images/s is each loader's ceiling (loading alone), not "
                           "your training speed")
    assert "--step-ms MS or --model NAME says which loader keeps your step fed" in last


def test_with_a_step_the_verdict_replaces_it(store, capsys, clock, fake_loaders):  # noqa: F811
    # A 40 ms step: the steady loader at 2 ms a batch keeps it fed (waiting 2/42 of the time); the bursty one
    # waits ~1 s of every ~2.3 s.
    quick = fake_loaders(paced(clock, lambda k: 0.002))
    burst = fake_loaders(paced(clock, bursty))
    assert main(["bench", "--data", str(store), "--loader", quick, "--loader", burst, "--seconds", "4",
                 "--step-ms", "40", *FAST]) == 0
    table = capsys.readouterr().out
    last = table.rstrip().splitlines()[-1]
    assert "no verdict" not in table
    assert last.startswith(f"verdict with a 40 ms step: kept fed by {quick} (waiting for data: {quick} 5% of the "
                           "time, at most 15% counts as fed): there the step sets the training speed; starved by "
                           f"{burst} 4")

    assert main(["bench", "--data", str(store), "--loader", burst, "--seconds", "4", "--step-ms", "40", *FAST]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith(f"verdict with a 40 ms step: every loader starves it (waiting for data: {burst} 4")
    assert "loading sets the training speed; to go faster: --loader shm" in last


# --- progress -----------------------------------------------------------------------------------------------

def test_progress_in_a_log_file_is_plain_lines(store, capsys, clock, fake_loaders):  # noqa: F811
    steady = fake_loaders(paced(clock, lambda k: STEADY))
    args = ["bench", "--data", str(store), "--loader", steady, "--seconds", "1", "--imgsz", "128", "--batch", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err   # pytest's capture: not a terminal, as a log file
    assert "\r" not in err
    assert f"{steady}: first batch in " in err and "; timing 1 s" in err
    assert f"{steady}: 128 images in 1.0 s, 128 images/s" in err

    assert main([*args, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_on_a_terminal_a_bar_is_drawn(store, capsys, clock, fake_loaders, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    steady = fake_loaders(paced(clock, lambda k: STEADY))
    assert main(["bench", "--data", str(store), "--loader", steady, "--seconds", "1", "--imgsz", "128",
                 "--batch", "2"]) == 0
    err = capsys.readouterr().err
    assert "\r" in err and f"{steady}: 128 images in 1.0 s" in err
