#!/usr/bin/env bash
# The GPU check (<= 8 minutes, nothing downloaded): rollouts (vLLM, or the hf backend where vLLM
# is not installed), a bf16 PPO update and the trainer/sampler log-prob gap on a from-scratch
# Qwen2 of Qwen2-0.5B's shape, or with --model on real weights; the numbers and how they are
# measured are in benchmarks/gpu_check.py. Needs the project's dependencies (pip install -e
# '.[gpu]' adds vLLM's CUDA build) and one NVIDIA GPU. Usage:
#   benchmarks/gpu_check.sh [gpu_check.py arguments, e.g. --episodes 256 or --model FILE.gguf]
# On a machine without a package index, GPU_CHECK_WHEELS=DIR first installs the wheels in DIR
# (no index, no dependencies) into a temporary folder put on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
# The whole check must fit in 8 minutes (vLLM's start-up, torch.compile and CUDA graphs included).
LIMIT_S=${GPU_CHECK_LIMIT_S:-480}

if [[ -n "${GPU_CHECK_WHEELS:-}" ]]; then
  site=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$GPU_CHECK_WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: torch sees no GPU')"
"$PY" -c "import vllm" 2>/dev/null || echo "gpu_check.sh: vllm is not installed (pip install -e '.[gpu]'): rollouts use the hf backend" >&2

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # the model is built from a config; nothing to fetch
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout "$LIMIT_S" "$PY" benchmarks/gpu_check.py --device cuda "$@"
