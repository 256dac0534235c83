"""Preemption: a stop signal costs at most the step in flight, --save-every-min bounds what a kill -9 loses,
and --resume after either ends with the weights of the uninterrupted run (CPU, same seed). The run is a
child process here (signals to it, or to its whole process group as SLURM and torchrun send them); the DDP
case is in test_train_preempt_ddp.py."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch
from train_helpers import TINY, finish, packed_sample, rows, same_weights, start_train, train_args, wait_for_rows

from fastfeed.cli import main
from fastfeed.preempt import EXIT_PREEMPTED, SaveTimer, StopSignals
from fastfeed.train import TrainConfig, load_checkpoint, train
from fastfeed.train.checkpoint import remove_stale_temporaries

# 16 images / batch 2 = 8 steps per epoch, mosaic in both epochs, one loader worker (a child of the run that
# gets the group's signals too).
RUN = dict(epochs=2, close_mosaic=0, workers=1)
STEPS = 16


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


@pytest.fixture(scope="module")
def uninterrupted(store, tmp_path_factory):
    """The reference: the same run, start to end, in a child process like the interrupted ones."""
    out = tmp_path_factory.mktemp("uninterrupted")
    rc, _, err = finish(start_train(train_args(store, out, **RUN)))
    assert rc == 0, err[-3000:]
    return load_checkpoint(out / "last.pt")


def _same_run(a: dict, b: dict) -> None:
    assert (a["epoch"], a["step"], a["batches_done"]) == (b["epoch"], b["step"], b["batches_done"])
    for part in ("model", "ema"):
        for k, v in a[part].items():
            assert torch.allclose(v.float(), b[part][k].float(), rtol=1e-5, atol=1e-6), (part, k)


def _resume(store, out) -> dict:
    rc, _, err = finish(start_train(train_args(store, out, resume=True, **RUN)))
    assert rc == 0, err[-3000:]
    return load_checkpoint(out / "last.pt")


@pytest.mark.slow
def test_sigterm_at_a_random_mid_epoch_step_costs_at_most_that_step_and_resume_matches(store, tmp_path, uninterrupted):
    seed = int(os.environ.get("FF_TEST_SEED", time.time_ns() % 10_000))
    k = random.Random(seed).choice([s for s in range(1, STEPS) if s % 8])   # not at an epoch's end
    proc = start_train(train_args(store, tmp_path, **RUN))
    logged = wait_for_rows(tmp_path, k, proc)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)          # the whole group: the run and its loader worker
    rc, out, err = finish(proc)
    took = time.monotonic() - sent
    assert rc == EXIT_PREEMPTED, f"seed {seed}: {err[-3000:]}"
    assert "SIGTERM: finishing the step in flight" in err and "continue with --resume" in out
    ck = load_checkpoint(tmp_path / "last.pt")
    assert ck["stopped_by"] == "SIGTERM" and not ck["eval_pending"]
    # The steps logged when the signal came, plus at most the one in flight.
    assert k <= ck["step"] <= k + 1, f"seed {seed}: signalled after step {k}, stopped after {ck['step']}"
    assert (ck["epoch"], ck["batches_done"]) == divmod(ck["step"], 8)
    # Within one step plus one checkpoint write (and the process's own exit), with a margin for a loaded machine.
    step_s = max(r["compute_ms"] + r["data_ms"] for r in logged) / 1e3 * TINY["accum"]
    write_s = rows(tmp_path, "checkpoint")[-1]["seconds"]
    summary = rows(tmp_path, "summary")[-1]
    assert summary["stopped_by"] == "SIGTERM" and summary["stop_seconds"] <= 3 * (step_s + write_s) + 2.0
    assert took <= 3 * (step_s + write_s) + 10.0, f"{took:.1f} s from SIGTERM to exit (step {step_s:.2f} s)"
    # --resume continues with the next batch: the weights of the run that was never stopped.
    _same_run(_resume(store, tmp_path), uninterrupted)


@pytest.mark.slow
def test_save_every_min_bounds_what_a_kill_9_loses(store, tmp_path, uninterrupted):
    proc = start_train(train_args(store, tmp_path, save_every_min=1e-4, **RUN))   # 6 ms: after every step
    saves = wait_for_rows(tmp_path, 5, proc, event="checkpoint")
    os.killpg(proc.pid, signal.SIGKILL)           # no notice at all
    finish(proc)
    assert {r["why"] for r in saves} == {"timer"} and all(r["seconds"] > 0 and r["bytes"] > 0 for r in saves)
    ck = load_checkpoint(tmp_path / "last.pt")    # whole: written beside, renamed over
    assert ck["step"] >= saves[-1]["step"] and ck["batches_done"] > 0 and ck["stopped_by"] is None
    _same_run(_resume(store, tmp_path), uninterrupted)
    assert not list(tmp_path.glob(".last.pt.tmp*"))   # a write the kill cut short was cleaned up


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_at_once(store, tmp_path):
    marker = tmp_path / "steps-started"
    # Step 1 at full speed; step 2 sleeps 120 s before it trains: a run that waited for it could not exit within
    # 60 s, whatever the machine's load (a 3 s step against a 2.5 s bound was a race on a busy machine).
    proc = start_train(train_args(store, tmp_path, **RUN), slow_steps=120.0, slow_from=2, marker=marker)
    wait_for_rows(tmp_path, 1, proc)              # step 1 done
    deadline = time.monotonic() + 60
    while (not marker.exists() or len(marker.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)                          # step 2 is in flight (a signal between steps stops at once)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    rc, _, err = finish(proc)
    took = time.monotonic() - sent
    assert rc == 130, err[-3000:]
    assert "SIGINT: finishing the step in flight" in err and "Ctrl-C again aborts" in err
    assert "SIGINT again: aborting as soon as the running operation returns" in err and "interrupted" in err
    assert took < 60, f"{took:.1f} s from the second Ctrl-C to exit: it waited for the step"
    assert not (tmp_path / "last.pt").exists() and not list(tmp_path.glob(".*.tmp*"))   # nothing half-written


# --- in the test's own process: each signal, the evaluation, --resume auto --------------------------------------

def _signal_after(monkeypatch, step: int, sig, where="fastfeed.train.loop.optimizer_step"):
    """Send `sig` to this process while optimizer step `step` runs (1-based)."""
    import fastfeed.train.loop as loop

    real, calls = loop.optimizer_step, {"n": 0}

    def step_then_signal(run, batches, n):
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), sig)         # arrives inside the step: the step still finishes
        return real(run, batches, n)

    monkeypatch.setattr(loop, "optimizer_step", step_then_signal)


IN_PROCESS = TINY | {"epochs": 2, "close_mosaic": 0}


@pytest.fixture(scope="module")
def five_steps(store, tmp_path_factory):
    """The reference for a run stopped after step 3 and resumed to step 5: 5 steps uninterrupted (run once)."""
    return train(TrainConfig(data=store, out=tmp_path_factory.mktemp("ref"), max_steps=5, **IN_PROCESS))


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGINT])
def test_sigusr1_and_a_first_ctrl_c_stop_after_the_step_in_flight(store, tmp_path, monkeypatch, sig, five_steps):
    cfg = IN_PROCESS
    before = signal.getsignal(sig)
    _signal_after(monkeypatch, 3, sig)
    res = train(TrainConfig(data=store, out=tmp_path / "a", **cfg))
    assert res.summary["stopped_by"] == sig.name and res.summary["step"] == 3
    assert signal.getsignal(sig) is before        # the run's handlers are gone with it
    ck = load_checkpoint(tmp_path / "a" / "last.pt")
    assert (ck["epoch"], ck["step"], ck["batches_done"], ck["stopped_by"]) == (0, 3, 3, sig.name)
    monkeypatch.undo()
    b = train(TrainConfig(data=store, out=tmp_path / "a", resume=True, max_steps=5, **cfg))
    assert b.summary["stopped_by"] is None and b.summary["images"] == 2 * 2   # steps 4 and 5 only
    same_weights(five_steps.model, b.model)
    same_weights(five_steps.ema, b.ema)


def test_a_signal_during_the_evaluation_abandons_it_and_the_resumed_run_does_it_first(store, tmp_path, monkeypatch):
    import fastfeed.train.loop as loop

    cfg = TINY | {"epochs": 2, "batch": 8, "val": store}   # 2 steps per epoch
    real = loop.evaluate

    def signalled(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(loop, "evaluate", signalled)
    res = train(TrainConfig(data=store, out=tmp_path, **cfg))
    assert res.summary["stopped_by"] == "SIGTERM" and res.evals == [] and res.summary["epoch"] == 1
    ck = load_checkpoint(tmp_path / "last.pt")
    assert (ck["epoch"], ck["step"], ck["batches_done"], ck["eval_pending"]) == (1, 2, 0, True)
    monkeypatch.undo()
    res = train(TrainConfig(data=store, out=tmp_path, resume=True, **cfg))
    assert [(e["epoch"], e["step"]) for e in res.evals] == [(1, 2), (2, 4)]   # epoch 1's evaluation, then on
    assert res.summary["stopped_by"] is None and not load_checkpoint(tmp_path / "last.pt")["eval_pending"]
    assert (tmp_path / "best.pt").is_file()


def test_resume_auto_starts_a_run_or_continues_it(store, tmp_path, capsys):
    args = train_args(store, tmp_path, max_steps=2, resume="auto", json=True)
    assert main(args) == 0
    assert rows(tmp_path, "start") and not rows(tmp_path, "resume")
    args[args.index("--max-steps") + 1] = "3"
    assert main(args) == 0
    assert len(rows(tmp_path, "resume")) == 1 and load_checkpoint(tmp_path / "last.pt")["step"] == 3
    capsys.readouterr()
    assert main(train_args(store, tmp_path, save_every_min=0)) == 2
    assert "--save-every-min must be a number of minutes > 0" in capsys.readouterr().err


# --- the parts ---------------------------------------------------------------------------------------------

def test_stop_signals_flag_once_abort_on_a_second_ctrl_c_and_restore_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    with StopSignals() as stop:
        assert stop.requested is None and not stop.stop_now(1) and stop.flag() == 0.0
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)      # a repeat (another process forwarding it) changes nothing
        assert stop.requested == "SIGTERM" and stop.stop_now(1) and stop.flag() == 1.0
        assert not stop.stop_now(2)               # under DDP only once every rank has it
        stop.note(0.0)
        assert not stop.stop_now(2)
        stop.note(0.5)                            # a mean over 2 ranks: one of them was signalled
        assert stop.stop_now(2) and stop.reason() == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):   # Ctrl-C after a stop request: abort
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before
    other = StopSignals()
    other.note(1.0)
    assert other.reason() == "a signal to another rank"


def test_save_timer():
    assert not SaveTimer(None).due()
    t = SaveTimer(1e-6)
    time.sleep(0.01)
    assert t.due()
    t.saved()
    assert SaveTimer(10).due() is False


def test_half_written_checkpoints_of_dead_writers_are_removed(tmp_path):
    dead = tmp_path / ".last.pt.tmp999999999"    # above any pid_max: no such process
    live = tmp_path / f".last.pt.tmp{os.getpid()}"
    other = tmp_path / ".notes.txt.tmp1"
    for p in (dead, live, other):
        p.write_bytes(b"partial")
    assert remove_stale_temporaries(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


def _handlers_here(q) -> None:
    q.put({s.name: repr(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)})


def test_processes_forked_under_the_handlers_get_the_previous_ones_back():
    """A pack or cache worker forked during a run must die of its pool's terminate() (SIGTERM), and its signals
    must not reach the run's watcher through an inherited wakeup pipe."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    before = {s.name: repr(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    with StopSignals() as stop:
        q = ctx.SimpleQueue()
        p = ctx.Process(target=_handlers_here, args=(q,))
        p.start()
        in_child = q.get()
        p.join(10)
        pool = ctx.Pool(1)
        assert pool.apply(os.getpid) != os.getpid()
        t = time.monotonic()
        pool.terminate()
        pool.join()
        assert time.monotonic() - t < 5
        time.sleep(0.2)
        assert stop.requested is None and stop.at is None   # the worker's SIGTERM was not this process's
    assert in_child == before
