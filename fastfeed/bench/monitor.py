"""The machine a bench runs on: what it is (`machine_info`: cores, RAM, CPU model, accelerator, library versions)
and a background thread sampling CPU per core and the memory of the main process plus its workers.

CPU: psutil's cumulative per-core times, snapshotted by the thread every `interval` and by `mark()`
at the edges of the timed window, so a window's utilisation is the exact difference of two
snapshots and the thread's snapshots in between give the busiest interval.

Memory: summed over the processes (this one and the loader's `memory_pids()`). RSS counts every
page a process maps, so pages shared between the parent and forked workers (torch, the shared batch
slots) are counted once per process; PSS splits each shared page between the processes that map it,
so a sum of PSS is the honest total. psutil gives PSS/USS on Linux; elsewhere only RSS is summed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
from importlib import metadata
from time import perf_counter

import psutil

from ..devices import DeviceError, device_name, parse_device
from ..procs import usable_cores


def _busy(a, b) -> tuple[float, float]:
    """(busy seconds, total seconds) of one core between two `cpu_times` snapshots."""
    total = sum(b) - sum(a)
    idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
    return max(total - idle, 0.0), max(total, 0.0)


class ResourceMonitor:
    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self._pids: list[int] = [os.getpid()]
        self._procs: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu: list[tuple[float, list]] = []     # (time, per-core cpu_times)
        self.peak: dict[str, int] = {}              # metric -> peak sum over processes
        self.metrics: set[str] = set()              # which metrics every sample had
        self.max_processes = 1

    def set_pids(self, pids) -> None:
        """Processes to sum (this process is always included). Called from the main thread."""
        with self._lock:
            self._pids = [os.getpid(), *[p for p in pids if p != os.getpid()]]

    def start(self) -> ResourceMonitor:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="fastfeed-bench-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def mark(self) -> float:
        """Snapshot CPU now (a window edge); returns the time used."""
        t = perf_counter()
        snap = psutil.cpu_times(percpu=True)
        with self._lock:
            self.cpu.append((t, snap))
        return t

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        self.mark()
        with self._lock:
            pids = list(self._pids)
        sums: dict[str, int] = {}
        have: set[str] | None = None
        alive = 0
        for pid in pids:
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                try:
                    info = proc.memory_full_info()
                except psutil.AccessDenied:
                    info = proc.memory_info()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            alive += 1
            fields = {k for k in ("rss", "pss", "uss") if hasattr(info, k)}
            have = fields if have is None else have & fields
            for k in fields:
                sums[k] = sums.get(k, 0) + int(getattr(info, k))
        if have is None:
            return
        with self._lock:
            self.metrics = have if not self.metrics else self.metrics & have
            for k in have:
                self.peak[k] = max(self.peak.get(k, 0), sums[k])
            self.max_processes = max(self.max_processes, alive)

    def cpu_between(self, t0: float, t1: float) -> dict:
        """Per-core and total utilisation (percent) between two marks, and the busiest sampled interval."""
        with self._lock:
            snaps = [(t, s) for t, s in self.cpu if t0 <= t <= t1]
        if len(snaps) < 2:
            return {"per_core_percent": [], "total_percent": None, "peak_interval_percent": None, "samples": 0}
        (_, a), (_, b) = snaps[0], snaps[-1]
        per_core = [_busy(x, y) for x, y in zip(a, b)]
        busy, total = map(sum, zip(*per_core))
        peak = 0.0
        for (_, x), (_, y) in zip(snaps, snaps[1:]):
            used, tot = map(sum, zip(*(_busy(u, v) for u, v in zip(x, y))))
            if tot > 0:
                peak = max(peak, 100 * used / tot)
        return {"per_core_percent": [round(100 * u / t, 1) if t > 0 else 0.0 for u, t in per_core],
                "total_percent": round(100 * busy / total, 1) if total > 0 else 0.0,
                "peak_interval_percent": round(peak, 1), "samples": len(snaps)}

    def memory(self) -> dict:
        """Peak sums; `metric` is the figure to quote: PSS where every process gave it, else RSS."""
        with self._lock:
            metric = "pss" if "pss" in self.metrics else "rss"
            return {"metric": metric, "peak_bytes": self.peak.get(metric),
                    "peak_rss_bytes": self.peak.get("rss"), "peak_pss_bytes": self.peak.get("pss"),
                    "peak_uss_bytes": self.peak.get("uss"), "processes": self.max_processes}


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _dist_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


def _dali_version() -> str | None:
    # Any nvidia-dali-cudaXXX wheel; read from metadata so DALI itself is not imported.
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-dali"):
            return f"{dist.version} ({name})"
    return None


def machine_info(device: str = "cpu") -> dict:
    import cv2
    import numpy
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
                "opencv": cv2.__version__, "simplejpeg": _dist_version("simplejpeg"), "lmdb": _dist_version("lmdb"),
                "psutil": psutil.__version__, "dali": _dali_version(),
                "torch_npu": _dist_version("torch-npu", "torch_npu")}
    info = {"cpu_model": _cpu_model(), "cores_usable": usable_cores(), "cores_logical": psutil.cpu_count(logical=True),
            "cores_physical": psutil.cpu_count(logical=False), "ram_bytes": psutil.virtual_memory().total,
            "platform": platform.platform(), "versions": versions, "accelerator": None}
    kind = parse_device(device)[0]
    if kind in ("cuda", "npu"):
        with contextlib.suppress(DeviceError, ImportError):   # not on this machine: the bench says so elsewhere
            if (name := device_name(device)) is not None:
                info["accelerator"] = {"kind": kind, "name": name} | ({"cuda": torch.version.cuda} if kind == "cuda" else {})
    return info
