# fastfeed: `make demo` packs the bundled sample and benchmarks it; `make test` runs the tests.
# Everything installs into .venv with the CPU build of PyTorch pinned (an unpinned torch pulls
# a multi-GB CUDA build). Override on a GPU machine: make TORCH_SPEC='torch>=2.6' ...

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,plot,dali
PY := $(VENV)/bin/python
OUT ?= build/demo

.PHONY: venv venv-ultralytics demo test test-all test-ultralytics lint bench-pack clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	touch $@

demo: venv
	@mkdir -p $(OUT)
	$(VENV)/bin/fastfeed pack -o $(OUT)/sample.ff --force
	$(VENV)/bin/fastfeed inspect $(OUT)/sample.ff
	$(VENV)/bin/fastfeed verify $(OUT)/sample.ff --decode
	$(PY) benchmarks/pack.py --quick
	$(VENV)/bin/fastfeed bench --data $(OUT)/sample.ff --loader all --seconds 5 --imgsz 320 --batch 4 --plot $(OUT)/bench.png --json $(OUT)/bench.json

# Fast suite (no `slow`); pytest's exit code 5 means "no tests collected", which is not a failure here.
test: venv
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-all: venv
	$(PY) -m pytest -q -p no:cacheprovider; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

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
	$(ULTRA_PY) -m pip install --quiet $(ULTRA_TORCH)
	$(ULTRA_PY) -m pip install --quiet -e ".[dev,ultralytics]" $(ULTRA_TORCH)
	touch $@

test-ultralytics: venv-ultralytics
	YOLO_OFFLINE=1 $(ULTRA_PY) -m pytest -q -p no:cacheprovider tests/integrations; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

lint: venv
	$(VENV)/bin/ruff check fastfeed tests benchmarks tools

bench-pack: venv
	$(PY) benchmarks/pack.py

clean:
	rm -rf build .pytest_cache
