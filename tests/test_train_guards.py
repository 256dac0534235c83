"""What `fastfeed train` says and keeps when a user would otherwise be misled or lose work: --eval-only and
--resume at the checkpoint's size, the measured pace after the first step (and, at a signal, when the step in
flight should end), an --out that already holds a run, a checkpoint disk that is full."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

import pytest
from train_helpers import TINY, finish, packed_sample, rows, start_train, train_args

from fastfeed.cli import main
from fastfeed.preempt import EXIT_PREEMPTED
from fastfeed.train import load_checkpoint


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def _train(store, out, *extra) -> list[str]:
    return train_args(store, out) + list(extra)


def test_eval_only_and_resume_use_the_checkpoint_imgsz_unless_imgsz_is_given(store, tmp_path, capsys):
    assert main(_train(store, tmp_path, "--max-steps", "1")) == 0      # trained at 64 (TINY)
    capsys.readouterr()
    ev = ["train", "--val", str(store), "--eval-only", "--weights", str(tmp_path / "last.pt"), "--workers", "0",
          "--quiet"]
    assert main(ev) == 0
    out, err = capsys.readouterr()
    assert " at 64: mAP@0.5 " in out                                    # not at 640
    assert f"evaluating at imgsz 64, the size {tmp_path / 'last.pt'} was trained at" in err
    assert main(ev + ["--imgsz", "96"]) == 0
    out, err = capsys.readouterr()
    assert " at 96: mAP@0.5 " in out
    assert f"evaluating at --imgsz 96; {tmp_path / 'last.pt'} was trained at 64" in err
    # --resume without --imgsz continues at the run's size (no "resuming with --imgsz 640")
    args = [a for a in _train(store, tmp_path, "--max-steps", "2", "--resume", "--json") if a]
    i = args.index("--imgsz")
    del args[i:i + 2]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert '"imgsz": 64' in out and "resuming at imgsz 64" in err and "resuming with --imgsz" not in err


def test_a_stop_before_the_first_step_leaves_a_last_pt_that_resume_continues(store, tmp_path, capsys, monkeypatch):
    """A notice during set-up (the signal handlers are in place from the start): the run stops before its first
    step, and the last.pt its message names is there (step 0), so --resume continues instead of a dead end."""
    import fastfeed.train.loop as loop

    set_up = loop.set_up

    def noticed(*a, **kw):
        run = set_up(*a, **kw)
        os.kill(os.getpid(), signal.SIGTERM)   # caught by the run's StopSignals: a stop requested
        return run

    monkeypatch.setattr(loop, "set_up", noticed)
    assert main(_train(store, tmp_path, "--max-steps", "2")) == EXIT_PREEMPTED
    err = capsys.readouterr().err
    assert "stopped after step 0 (epoch 1/" in err and f"{tmp_path / 'last.pt'} holds it: continue with --resume" in err
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 0
    monkeypatch.setattr(loop, "set_up", set_up)
    assert main(_train(store, tmp_path, "--max-steps", "2", "--resume")) == 0
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 2


def test_a_loader_worker_that_dies_mid_epoch_leaves_last_pt_and_one_error(store, tmp_path, capsys, monkeypatch):
    """A worker killed (the OOM killer, a segfault in a decoder): last.pt at the last finished step, the worker's exit
    named with where training stopped and how to continue, no traceback; --resume finishes the run."""
    from fastfeed.train.report import Reporter

    step_done = Reporter.step_done

    def kill_at_step_2(self, *a, **kw):
        step_done(self, *a, **kw)
        if self.run.step == 2:
            for pid in self.run.loader.memory_pids():
                os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(Reporter, "step_done", kill_at_step_2)
    assert main(_train(store, tmp_path, "--workers", "1", "--epochs", "1")) == 1
    err = capsys.readouterr().err
    assert "exited unexpectedly with code -9" in err and "Traceback" not in err, err
    assert f"{tmp_path / 'last.pt'} holds the last finished step: continue with the same command and --resume" in err
    step = load_checkpoint(tmp_path / "last.pt")["step"]
    assert step >= 2 and f"training stopped at epoch 1, step {step} (" in err
    monkeypatch.setattr(Reporter, "step_done", step_done)
    assert main(_train(store, tmp_path, "--workers", "1", "--epochs", "1", "--resume")) == 0
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 8   # 16 images, batches of 2: the epoch's 8 steps


def test_a_loader_worker_that_raises_is_named_in_one_line_with_its_cause(store, tmp_path, capsys):
    """A worker that raises (a damaged record): its exception in the error's first line, where training stopped and
    --resume in the next, no traceback (-v logs it)."""
    import shutil

    from store_helpers import flip_byte_in_record

    bad = tmp_path / "bad.ff"
    shutil.copytree(store, bad)
    flip_byte_in_record(bad, 5)
    assert main(_train(bad, tmp_path / "run", "--workers", "1", "--epochs", "1")) == 1
    err = capsys.readouterr().err
    first = next(x for x in err.splitlines() if x.startswith("fastfeed: error: "))
    assert "loader worker 0 failed on batch" in first and "record 5 in shard shard-00000.mdb: CRC32 mismatch" in first
    assert "Traceback" not in err and "(-v shows the worker's traceback)" in err
    assert "holds the last finished step: continue with the same command and --resume" in err


def test_an_out_that_cannot_be_a_folder_is_one_line(store, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(_train(store, tmp_path / "afile", "--max-steps", "1")) == 1
    assert f"--out {tmp_path / 'afile'} cannot be the run's folder (a file is there): give another --out" in \
        capsys.readouterr().err
    assert main(_train(store, tmp_path / "afile" / "run", "--max-steps", "1")) == 1
    err = capsys.readouterr().err
    assert "cannot be the run's folder" in err and "Traceback" not in err


def test_a_resume_with_a_larger_batch_is_not_taken_for_an_out_of_memory(store, tmp_path, capsys):
    """The checkpoint's micro-batch is its --batch (no out-of-memory halved it): a resume with --batch 4 trains
    micro-batches of 4, without the out-of-memory warning; a resume with another --loader says so."""
    assert main(_train(store, tmp_path, "--max-steps", "1", "--batch", "2")) == 0
    capsys.readouterr()
    assert main(_train(store, tmp_path, "--max-steps", "2", "--batch", "4", "--resume", "--json")) == 0
    out, err = capsys.readouterr()
    assert "running out of memory" not in err and json.loads(out)["micro_batch"] == 4
    assert main(_train(store, tmp_path, "--max-steps", "3", "--batch", "4", "--resume", "--loader", "shm")) == 0
    assert "resuming with --loader shm; the run used cpu" in capsys.readouterr().err   # it renders its own way


def test_a_second_run_into_an_out_in_use_is_refused_naming_the_first(store, tmp_path, capsys):
    """Two runs into one --out would interleave metrics.jsonl and last.pt: the second is one line naming the first's
    pid (held here as a running run holds it), and nothing of it is written."""
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    fd = os.open(tmp_path / ".train.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, b"4242", 0)
        assert main(_train(store, tmp_path, "--max-steps", "1", "--resume", "auto")) == 1
        assert f"--out {tmp_path} is in use by another training run (pid 4242)" in capsys.readouterr().err
        assert not (tmp_path / "metrics.jsonl").exists()
    finally:
        os.close(fd)   # the run ended: its lock goes with it
    assert main(_train(store, tmp_path, "--max-steps", "1", "--resume", "auto")) == 0


def test_resume_and_eval_only_refuse_a_store_of_other_classes(store, tmp_path, capsys, yolo_builder):
    """The same number of classes under other names (the same images packed from a YOLO export without data.yaml's
    names, say): a resume or an evaluation would silently score or train the wrong classes."""
    from store_helpers import run_pack

    from fastfeed import Store

    assert main(_train(store, tmp_path / "run", "--max-steps", "1")) == 0
    names = Store(store).class_names
    other = yolo_builder(names=[f"c{i}" for i in range(len(names))])
    for k in range(4):
        other.add(f"{k}", ["0 0.5 0.5 0.2 0.2"], seed=k)
    run_pack(other.root, tmp_path / "other.ff")
    capsys.readouterr()
    assert main(_train(tmp_path / "other.ff", tmp_path / "run", "--max-steps", "2", "--resume")) == 1
    assert f"was trained on other classes than --data {tmp_path / 'other.ff'} (class 0 is {names[0]!r} there, " \
           "'c0' here): resume with the run's --data" in capsys.readouterr().err
    ev = ["train", "--eval-only", "--weights", str(tmp_path / "run" / "last.pt"), "--val", str(tmp_path / "other.ff"),
          "--workers", "0", "--quiet"]
    assert main(ev) == 1
    assert "was trained on other classes than --val" in capsys.readouterr().err


def test_an_out_holding_a_run_is_refused_without_resume_or_force(store, tmp_path, capsys):
    assert main(_train(store, tmp_path, "--max-steps", "1")) == 0
    capsys.readouterr()
    before = (tmp_path / "last.pt").read_bytes()
    assert main(_train(store, tmp_path, "--max-steps", "1")) == 1
    err = capsys.readouterr().err
    assert f"--out {tmp_path} already holds a run (last.pt, metrics.jsonl): continue it with --resume" in err
    assert "--force" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "last.pt").read_bytes() == before and len(rows(tmp_path, "start")) == 1   # untouched
    assert main(_train(store, tmp_path, "--max-steps", "1", "--force", "--batch", "100000")) == 1   # refused in set-up
    assert "more than the store's" in capsys.readouterr().err
    assert (tmp_path / "last.pt").read_bytes() == before and len(rows(tmp_path, "start")) == 1   # --force: untouched
    assert main(_train(store, tmp_path, "--max-steps", "2", "--force")) == 0
    err = capsys.readouterr().err
    assert f"--force: starting a new run in {tmp_path}: removed its metrics.jsonl" in err
    assert "its last.pt is replaced at the first checkpoint" in err
    assert len(rows(tmp_path, "start")) == 1 and load_checkpoint(tmp_path / "last.pt")["step"] == 2   # anew
    (tmp_path / "last.pt").unlink()                                     # metrics.jsonl alone is a run too
    assert main(_train(store, tmp_path, "--max-steps", "1")) == 1
    assert "already holds a run (metrics.jsonl)" in capsys.readouterr().err


@pytest.mark.slow
def test_the_pace_after_the_first_step_and_what_a_signal_waits_for(store, tmp_path):
    """A run of hours on the CPU: after step 1 the measured step time, the epoch's and the run's estimate, and the
    smaller settings; a SIGTERM in step 2 says when that step should end."""
    marker = tmp_path / "steps"
    proc = start_train(train_args(store, tmp_path / "run", epochs=20000), slow_steps=1.5, marker=marker)
    try:
        import time

        deadline = time.monotonic() + 120
        while not (marker.is_file() and len(marker.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)
    finally:
        rc, _, err = finish(proc, timeout=120)
    assert rc == EXIT_PREEMPTED, err[-3000:]
    pace = next(x for x in err.splitlines() if "the first step took" in x)
    assert "an epoch (8 steps) takes ~" in pace and "the 159999 steps left ~" in pace and pace.endswith("days")
    assert "on a CPU this run takes ~" in err and "fewer --epochs (now 20000) or --max-steps N" in err
    ack = next(x for x in err.splitlines() if x.startswith("fastfeed: SIGTERM:"))
    assert "steps take ~" in ack and "the one in flight" in ack and "should end in ~" in ack
    before, row = rows(tmp_path / "run", "pace")   # the cost measured before the first step, then the step's
    assert before["step"] == 0 and before["how"].startswith("cost, before the first step")
    assert row["step"] == 1 and row["step_s"] >= 1.5 and row["run_s"] == pytest.approx(row["step_s"] * 159999)


@contextlib.contextmanager
def tmpfs(path, size: int):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_checkpoint_disk_that_fills_is_one_line_and_the_previous_checkpoint_stays(store, tmp_path, capsys):
    """A real small filesystem: room for one checkpoint, not for the second beside it (writes are atomic)."""
    assert main(_train(store, tmp_path / "probe", "--max-steps", "1")) == 0
    one = (tmp_path / "probe" / "last.pt").stat().st_size
    capsys.readouterr()
    with tmpfs(tmp_path / "small", int(one * 1.5)) as out:
        assert main(_train(store, out)) == 1                            # 2 epochs: a checkpoint at each end
        err = capsys.readouterr().err
        line = next(x for x in err.splitlines() if "error:" in x)
        assert f"no space left in {out} to write last.pt (needs about " in line
        assert "the previous last.pt is intact: checkpoints are written atomically" in line
        assert "--resume" in line and "Traceback" not in err and "inline_container" not in err
        ck = load_checkpoint(out / "last.pt")                           # the first epoch's, whole
        assert (ck["epoch"], ck["step"], ck["batches_done"]) == (1, 8, 0)
        assert sorted(p.name for p in out.iterdir()) == ["last.pt", "metrics.jsonl"]   # no half-written temporary
    assert TINY["epochs"] == 2
