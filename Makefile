# dualexport: build everything from nothing into .venv, then test, demo or benchmark.
# torch is installed first and pinned exactly (the CPU wheel lies on the machine's disk; an
# unpinned torch pulls a multi-GB CUDA build).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.dualexport-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONWARNINGS := ignore

.PHONY: install lint test test-all test-slow demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --disable-pip-version-check -q torch==2.13.0
	$(PIP) install --disable-pip-version-check -q -e '.[test]'
	$(PY) -c "import torch, executorch, onnxruntime, dualexport; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

# Lint, format, types and the import layers (pyproject.toml: [tool.ruff], [tool.mypy],
# [tool.importlinter]): checks, not opinions.
lint: install
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# The default run: the checks, then the fast cases (well under CI's budget on 2 cores).
test: lint
	$(PY) -m pytest -m "not slow" -q -p no:cacheprovider

# Slow cases alone (real Hugging Face architectures, big models).
test-slow: install
	$(PY) -m pytest -m slow -q -p no:cacheprovider

test-all: install
	$(PY) -m pytest -q -p no:cacheprovider

demo: install
	$(PY) -m dualexport.demo --out demo_out

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf demo_out .pytest_cache build src/*.egg-info
