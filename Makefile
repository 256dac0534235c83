# fastfeed: `make demo` packs the bundled sample and benchmarks it; `make test` runs the fast tests
# (under 5 minutes on 2 cores), `make test-slow` the rest, `make ci` what .ci/run runs.
# Everything installs into .venv with the CPU build of PyTorch pinned (an unpinned torch pulls
# a multi-GB CUDA build). Override on a GPU machine: make TORCH_SPEC='torch>=2.6' ...

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,plot,dali
PY := $(VENV)/bin/python
OUT ?= build/demo
# --no-compile: pip would byte-compile every installed module (torch, DALI, matplotlib...: minutes of CPU);
# Python compiles the few a run imports on first use instead.
PIP_INSTALL ?= -m pip install --quiet --no-compile
# pytest's exit code 5 means "no tests collected" (e.g. every test of a tier deselected), not a failure.
PYTEST_RC5 = rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

.PHONY: venv venv-ultralytics demo test test-slow test-all test-ultralytics ci lint bench-pack clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) "$(TORCH_SPEC)"
	$(PY) $(PIP_INSTALL) -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	touch $@

demo: venv
	@mkdir -p $(OUT)
	$(VENV)/bin/fastfeed pack -o $(OUT)/sample.ff --force
	$(VENV)/bin/fastfeed inspect $(OUT)/sample.ff
	$(VENV)/bin/fastfeed verify $(OUT)/sample.ff --decode
	$(PY) benchmarks/pack.py --quick
	$(VENV)/bin/fastfeed bench --data $(OUT)/sample.ff --loader all --seconds 5 --imgsz 320 --batch 4 --plot $(OUT)/bench.png --json $(OUT)/bench.json

# The fast tier: every test not marked `slow` (under 5 minutes on 2 cores). `slow` marks what is slow by
# nature (trainings in child processes, DDP ranks, signals and timeouts waited out, moto servers): the
# slow tier runs them, and .ci/run runs both, so no test goes unrun.
test: venv
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider; $(PYTEST_RC5)

test-slow: venv
	$(PY) -m pytest -q -m slow -p no:cacheprovider; $(PYTEST_RC5)

test-all: venv
	$(PY) -m pytest -q -p no:cacheprovider; $(PYTEST_RC5)

# The Ultralytics integration's tests, in their own venv: torch 2.14.1 + torchvision 0.29.1 (CPU builds work;
# with the CPU torch 2.13.0 torchvision's nms op is missing and Ultralytics cannot train), the headless
# build of Ultralytics (plain `ultralytics` pulls opencv-python, which overwrites our opencv-python-headless)
# and cloudpickle (Ultralytics' DDP launcher needs it, or tries to download it). benchmarks/ultralytics_ab.py
# and benchmarks/vs_ultralytics.py use the same venv.
ULTRA_VENV ?= .venv-ultralytics
ULTRA_TORCH ?= torch==2.14.1 torchvision==0.29.1
ULTRA_PY := $(ULTRA_VENV)/bin/python

venv-ultralytics: $(ULTRA_VENV)/.installed

$(ULTRA_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(ULTRA_VENV)
	$(ULTRA_PY) $(PIP_INSTALL) $(ULTRA_TORCH)
	$(ULTRA_PY) $(PIP_INSTALL) -e ".[dev,ultralytics]" $(ULTRA_TORCH)
	touch $@

# All of tests/integrations, slow ones included (they skip in .venv, which has no Ultralytics).
test-ultralytics: venv-ultralytics
	YOLO_OFFLINE=1 $(ULTRA_PY) -m pytest -q -p no:cacheprovider tests/integrations; $(PYTEST_RC5)

# What .ci/run runs (it also times each step): ruff, the fast tier, the slow tier, the Ultralytics tier.
ci: lint test test-slow test-ultralytics

lint: venv
	$(VENV)/bin/ruff check fastfeed tests benchmarks tools

bench-pack: venv
	$(PY) benchmarks/pack.py

clean:
	rm -rf build .pytest_cache
