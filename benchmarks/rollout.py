"""Rollout throughput of the backends side by side: ``hf``, ``vllm`` (and ``model.generate``).

Every backend runs the same multi-turn episodes (same model, questions, environment and seed)
through the same :class:`RolloutEngine`; only the backend differs:

- ``hf``: :class:`agentr1.rollout.backend.HFBackend` (a hand-written KV-cached decode loop with
  per-request seeded sampling; the cache is kept across an episode's turns, so each turn
  prefills only the new observation);
- ``hf-full`` (opt-in): the same backend re-prefilling the whole context every turn
  (``reuse_cache=False``, the path before cross-turn reuse);
- ``vllm``: :class:`agentr1.rollout.vllm_backend.VLLMBackend` (in-process vLLM, prefix caching);
- ``generate`` (opt-in): the plain approach, ``model.generate(...)`` on the left-padded batch
  each turn.

Each model size is measured in one process: ``tiny`` is the config's model, ``large`` a
512-wide, 8-layer one (~35M parameters) with the same tokenizer. Per backend it reports the
start-up time (building the backend, for vllm the engine), the best of ``--repeats`` runs in
action tokens and episodes per second of wall clock and per CPU second, and for vllm the time
of one weight sync. Run it with ``OMP_NUM_THREADS=1`` on a shared machine: the per-CPU-second
rates then stay comparable when other jobs take the cores. Usage::

    python benchmarks/rollout.py [--sizes tiny,large] [--backends hf,vllm] [--episodes 64]
                                 [--checkpoint DIR] [--repeats 2]

``--backends hf,hf-full,generate`` prints hf against per-turn ``generate`` and against its own
full-prefill path, per size, in the last columns of the table (the goal: hf >= 2x generate).

Without ``--checkpoint`` the models are fresh, so episodes are as long as an untrained policy
makes them (turns cut at the token limit, contexts filled).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from agentr1.config import load_config
from agentr1.recipe.warmup import build_model
from agentr1.recipe.workspace import Workspace, make_engine
from agentr1.rollout.backend import Generation, HFBackend, SamplingSpec
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from agentr1.rollout.vllm_backend import shutdown_engines
from models.policy import ModelSpec, build_policy, count_parameters

# The larger size: tens of millions of parameters, head size 64 (vLLM's CPU kernels need one
# of a fixed set).
LARGE = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 8, "intermediate_size": 2048}


class GenerateBackend:
    """The baseline: ``model.generate`` for the batch, once per turn."""

    def __init__(self, model, pad_token_id: int):
        self.model = model
        self.pad_token_id = pad_token_id

    def sync_weights(self, model) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts, spec: SamplingSpec, seeds) -> list[Generation]:
        torch.manual_seed(int(seeds[0]))
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        greedy = spec.temperature == 0
        out = self.model.generate(
            input_ids=ids, attention_mask=attn, max_new_tokens=spec.max_new_tokens,
            do_sample=not greedy, temperature=None if greedy else spec.temperature, top_p=None, top_k=None,
            eos_token_id=list(spec.stop_token_ids), pad_token_id=self.pad_token_id,
            output_scores=True, return_dict_in_generate=True,
        )
        new = out.sequences[:, width:]
        gens = []
        for i in range(len(prompts)):
            toks, lps = [], []
            for t in range(new.shape[1]):
                tok = int(new[i, t])
                toks.append(tok)
                lps.append(float(torch.log_softmax(out.scores[t][i].float(), -1)[tok]))
                if tok in spec.stop_token_ids:
                    break
            gens.append(Generation(toks, lps, "stop" if toks and toks[-1] in spec.stop_token_ids else "length"))
        return gens


def run(engine: RolloutEngine, records, seed: int) -> dict[str, float]:
    """Wall-clock rates, and the same per CPU second of this process (all its threads): on a
    shared machine the wall clock also counts time spent waiting for a core."""
    t0, c0 = time.perf_counter(), time.process_time()
    trajs = engine.run(records, seed=seed)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    act = sum(t.n_action_tokens for t in trajs)
    return {"seconds": dt, "cpu_seconds": cpu, "action_tokens": act, "action_tokens_per_s": act / dt,
            "action_tokens_per_cpu_s": act / cpu, "episodes_per_s": len(trajs) / dt,
            "episodes_per_cpu_s": len(trajs) / cpu, "turns": sum(len(t.turn_ends) for t in trajs) / len(trajs)}


def build_engine(name: str, cfg, ws, model, tokenizer, chat) -> RolloutEngine:
    baselines = {"generate": lambda: GenerateBackend(model.policy, chat.pad_token_id),
                 "hf-full": lambda: HFBackend(model.policy, chat.pad_token_id, reuse_cache=False)}
    if name in baselines:
        return RolloutEngine(baselines[name](), chat, tokenizer, ws.env,
                             RolloutSettings(cfg.env.max_turn_tokens, cfg.env.max_context_tokens))
    return make_engine(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"backend": name})}),
                       ws.env, model, tokenizer, chat, torch.device("cpu"))


def measure(name: str, cfg, ws, model, tokenizer, chat, records, repeats: int) -> dict[str, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    engine = build_engine(name, cfg, ws, model, tokenizer, chat)
    out = {"startup_s": time.perf_counter() - t0, "startup_cpu_s": time.process_time() - c0}
    runs = [run(engine, records, seed=r) for r in range(repeats)]
    out["first_run_s"] = runs[0]["seconds"]
    out.update(max(runs, key=lambda r: r["action_tokens_per_cpu_s"]))
    if name == "vllm":
        t0 = time.perf_counter()
        engine.backend.sync_weights(model.policy)
        out["weight_sync_s"] = time.perf_counter() - t0
        shutdown_engines()  # start the next size's engine from nothing
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="conf/train.yaml")
    ap.add_argument("--checkpoint", help="a trained policy directory for the tiny size (default: fresh)")
    ap.add_argument("--sizes", default="tiny,large")
    ap.add_argument("--backends", default="hf,vllm", help="comma-separated: hf, vllm, generate, hf-full")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-o", "--override", action="append", default=[])
    args = ap.parse_args()
    cfg = load_config(args.config, args.override)
    ws = Workspace.build(cfg)
    records = ws.splits["test"][: args.episodes]
    if args.checkpoint:
        from models.chat import ChatFormat
        from models.policy import load_actor_critic

        model, tokenizer = load_actor_critic(args.checkpoint)
        chat = ChatFormat(tokenizer, ws.tools)
    else:
        model, tokenizer, chat = build_model(cfg, ws, [], [])
    results: dict[str, dict] = {}
    for size in args.sizes.split(","):
        if size == "large":
            model = build_policy(ModelSpec.from_config(cfg.model, **LARGE), tokenizer, seed=cfg.seed)
        model.eval()
        results[size] = {"parameters": count_parameters(model.policy)}
        for name in args.backends.split(","):
            results[size][name] = measure(name, cfg, ws, model, tokenizer, chat, records, args.repeats)
            print(size, name, json.dumps(results[size][name]), flush=True)
    results["setup"] = {"episodes": args.episodes, "repeats": args.repeats, "threads": torch.get_num_threads(),
                        "checkpoint": args.checkpoint or "fresh", "max_turn_tokens": cfg.env.max_turn_tokens,
                        "max_context_tokens": cfg.env.max_context_tokens}
    print(json.dumps(results, indent=1))
    print(table(results, args.backends.split(",")))


def table(results: dict, backends: list[str]) -> str:
    """A markdown table: one row per (size, backend), with hf's speed-up over it (per CPU second;
    ">1x": hf is faster)."""
    header = ("| size (params) | backend | start-up s (CPU s) | action tok/s | tok/CPU-s | episodes/s | "
              "episodes/CPU-s | hf speed-up (per CPU-s) | hf speed-up (wall) |")
    rows = [header, "|" + "---|" * 9]
    for size, res in results.items():
        if size == "setup":
            continue
        hf = res.get("hf", {})
        for name in backends:
            r = res[name]
            ratios = [f"{hf[k] / r[k]:.2f}x" if hf else "-" for k in ("action_tokens_per_cpu_s", "action_tokens_per_s")]
            rows.append(f"| {size} ({res['parameters'] / 1e6:.1f}M) | {name} | {r['startup_s']:.1f} "
                        f"({r['startup_cpu_s']:.1f}) | {r['action_tokens_per_s']:.0f} | "
                        f"{r['action_tokens_per_cpu_s']:.0f} | {r['episodes_per_s']:.2f} | "
                        f"{r['episodes_per_cpu_s']:.2f} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
