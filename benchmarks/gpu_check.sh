#!/usr/bin/env bash
# GPU check of the device prefetcher on a bare GPU machine (PyTorch and nothing else), from the repo root:
#
#   bash benchmarks/gpu_check.sh [--quick] [--runner auto|pytest|builtin] [--step-ms 25] [--allow-cpu]
#
# Runs the `gpu` tests of tests/test_prefetch.py (pytest when present, else a built-in runner), measures
# H2D bandwidth (uint8 vs float32, pinned vs pageable) and copy/compute overlap with and without the
# DevicePrefetcher, the trainer, the device loader, yolov8n in Ultralytics' trainer fed by its loader and by
# fastfeed's cpu, shm and device loaders (images/s, data-wait share), and prints a short table last
# (benchmarks/gpu_check.py does the work; its docstring lists the sections). Well under
# 8 minutes: the Python side keeps to --budget (400 s); this wrapper stops it at 450 s whatever happens.
# Exit status: 0 all passed, 1 a test or a section failed, 2 no CUDA device, 124 the time limit.
set -u
cd "$(dirname "$0")/.." || exit 1

PY=""
for candidate in "${PYTHON:-}" python3 python .venv/bin/python; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" 2>/dev/null; then
        PY=$candidate
        break
    fi
done
if [ -z "$PY" ]; then
    echo "gpu_check: no Python with torch found (tried \$PYTHON, python3, python, .venv/bin/python)" >&2
    exit 1
fi

JSON=()
if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then
    JSON=(--json "${OUT}/gpu_check.json")
fi

export PYTHONDONTWRITEBYTECODE=1      # leave no __pycache__ behind in the copied tree
if command -v timeout >/dev/null 2>&1; then
    timeout --kill-after=10 450 "$PY" benchmarks/gpu_check.py "${JSON[@]}" "$@"
else
    "$PY" benchmarks/gpu_check.py "${JSON[@]}" "$@"
fi
rc=$?
[ "$rc" -eq 124 ] && echo "gpu_check: stopped at the 450 s limit (no table: rerun with --quick)" >&2
exit "$rc"
