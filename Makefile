# Bootstrap, run and test the Agent-R1 pipeline. Everything lives in .venv.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU wheel of torch 2.13.0 lies on this machine's disk; installing it first keeps pip
# from resolving the project's `torch>=2.4` to a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export MLFLOW_DISABLE_TELEMETRY ?= true
export DVC_NO_ANALYTICS ?= 1
export GX_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1

.PHONY: setup test test-fast train bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
	$(PIP) install -q $(TORCH_PIN) 2>&1 | grep -v "is ignored: it is neither" || true
	$(PIP) install -q -e '.[dev]' 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import torch, transformers, agentr1; print('torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $@

setup: $(VENV)/.installed

test: setup
	$(VENV)/bin/pytest -q

# The quick subset: everything not marked slow.
test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow"

train: setup
	$(VENV)/bin/agentr1 train --config conf/train.yaml

bench: setup
	$(PY) benchmarks/rollout.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
