#!/usr/bin/env bash
# The GPU check (<= 8 minutes, nothing downloaded): vLLM rollouts, a bf16 PPO update and the
# trainer/vLLM log-prob gap on a from-scratch Qwen2 of Qwen2-0.5B's shape; the numbers and how
# they are measured are in benchmarks/gpu_check.py. Needs the project installed with the `gpu`
# extra (pip install -e '.[gpu]': vLLM's CUDA build) and one NVIDIA GPU. Usage:
#   benchmarks/gpu_check.sh [extra gpu_check.py arguments, e.g. --episodes 256]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
# The whole check must fit in 8 minutes (vLLM's start-up, torch.compile and CUDA graphs included).
LIMIT_S=${GPU_CHECK_LIMIT_S:-480}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: torch sees no GPU')"
"$PY" -c "import vllm" 2>/dev/null || { echo "gpu_check.sh: vllm is not installed (pip install -e '.[gpu]')" >&2; exit 1; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # the model is built from a config; nothing to fetch
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout "$LIMIT_S" "$PY" benchmarks/gpu_check.py --device cuda "$@"
