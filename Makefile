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
# (pip's byte-compiling of what it installs is kept: where PYTHONDONTWRITEBYTECODE is set, as on this project's
# machines, nothing would cache the compiled modules later, and every process would compile torch afresh.)
PIP_INSTALL ?= -m pip install --quiet
# The versions each venv was built and tested with, as pip constraints: without them pip's resolver spent
# ~5 of the 7 minutes of a venv build weighing the releases on the indexes (PyPI too). For CPython
# 3.11 (what they were frozen on); on another Python, or to resolve afresh: make CONSTRAINTS= ULTRA_CONSTRAINTS=
# venv. After changing dependencies: make lock (rewrites both files from the venvs).
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
CONSTRAINTS ?= $(if $(filter 3.11,$(PY_VERSION)),constraints/venv.txt)
ULTRA_CONSTRAINTS ?= $(if $(filter 3.11,$(PY_VERSION)),constraints/venv-ultralytics.txt)
# pytest's exit code 5 means "no tests collected" (e.g. every test of a tier deselected), not a failure.
PYTEST_RC5 = rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

.PHONY: venv venv-ultralytics demo test test-slow test-all test-ultralytics ci lock lint bench-pack clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
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

$(ULTRA_VENV)/.installed: pyproject.toml $(ULTRA_CONSTRAINTS)
	$(PYTHON) -m venv $(ULTRA_VENV)
	$(ULTRA_PY) $(PIP_INSTALL) $(if $(ULTRA_CONSTRAINTS),-c $(ULTRA_CONSTRAINTS)) -e ".[dev,ultralytics]" $(ULTRA_TORCH)
	touch $@

# All of tests/integrations, slow ones included (they skip in .venv, which has no Ultralytics).
test-ultralytics: venv-ultralytics
	YOLO_OFFLINE=1 $(ULTRA_PY) -m pytest -q -p no:cacheprovider tests/integrations; $(PYTEST_RC5)

# What .ci/run runs (it also times each step): ruff, the fast tier, the slow tier, the Ultralytics tier.
ci: lint test test-slow test-ultralytics

# Freeze both venvs' versions into constraints/ (after a dependency change; torch comes from the specs above).
lock:
	@for pair in "$(VENV) constraints/venv.txt ^torch==" "$(ULTRA_VENV) constraints/venv-ultralytics.txt ^torch==\|^torchvision=="; do \
	  set -- $$pair; { sed -n '/^#/p' $$2; $$1/bin/python -m pip freeze --exclude-editable | grep -v -e '^-e' -e '^fastfeed' -e "$$3"; } > $$2.new && mv $$2.new $$2; done

lint: venv
	$(VENV)/bin/ruff check fastfeed tests benchmarks tools

bench-pack: venv
	$(PY) benchmarks/pack.py

clean:
	rm -rf build .pytest_cache
