"""Helpers for tests that start processes and kill them: a script in a fresh interpreter, its descendants,
and waiting until processes are gone (a zombie counts as gone: it holds no memory and no lock)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_script(code: str, *args, env: dict | None = None, **popen) -> subprocess.Popen:
    """`python -c code args...` with the tests folder importable; stdout is a pipe (see `read_line`)."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")]))
    e.update(env or {})
    popen.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=e, text=True, **popen)


def read_line(proc: subprocess.Popen, timeout: float = 120.0) -> str:
    """The next line the script prints (it must flush); fails naming its exit code if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if line:
                return line.strip()
        if proc.poll() is not None:
            raise AssertionError(f"the script exited with code {proc.returncode} before printing")
    raise AssertionError(f"the script printed nothing in {timeout:.0f} s")


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (neither gone nor a zombie)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to `timeout` s for every process to end; returns those still running."""
    deadline = time.monotonic() + timeout
    while (left := running(procs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_all(procs: list) -> None:
    """SIGKILL whatever is left of a test's processes (psutil.Process or Popen), by pid."""
    for p in procs:
        try:
            p.kill()
        except (psutil.NoSuchProcess, ProcessLookupError, OSError):
            pass
