"""Rollout throughput: our batched KV-cached engine vs. ``model.generate`` once per turn.

Both run the same multi-turn episodes (same model, questions, environment and seed) through
the same :class:`RolloutEngine`; only the backend differs:

- ``hf``: :class:`agentr1.rollout.backend.HFBackend` (one prefill, then a hand-written
  KV-cached decode loop with per-request seeded sampling);
- ``generate``: the plain approach, ``model.generate(...)`` on the left-padded batch each turn.

Prints action tokens/s, episodes/s and the ratio. Usage::

    python benchmarks/rollout.py [--checkpoint DIR] [--episodes 64] [--repeats 2]

Without ``--checkpoint`` it warms up nothing: it builds a fresh tiny model, so the
episodes are as long as an untrained policy makes them (turns cut at the token limit).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from agentr1.config import load_config
from agentr1.rollout.backend import Generation, SamplingSpec
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from agentr1.trainer import Workspace, build_model, make_engine


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
    t0 = time.perf_counter()
    trajs = engine.run(records, seed=seed)
    dt = time.perf_counter() - t0
    act = sum(t.n_action_tokens for t in trajs)
    return {"seconds": dt, "action_tokens": act, "action_tokens_per_s": act / dt,
            "episodes_per_s": len(trajs) / dt, "turns": sum(len(t.turn_ends) for t in trajs) / len(trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="conf/train.yaml")
    ap.add_argument("--checkpoint", help="a trained policy directory (default: a fresh tiny model)")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-o", "--override", action="append", default=[])
    args = ap.parse_args()
    cfg = load_config(args.config, args.override)
    ws = Workspace.build(cfg)
    if args.checkpoint:
        from models.chat import ChatFormat
        from models.policy import load_actor_critic

        model, tokenizer = load_actor_critic(args.checkpoint)
        chat = ChatFormat(tokenizer, ws.tools)
    else:
        model, tokenizer, chat = build_model(cfg, ws, [], [])
    model.eval()
    records = ws.splits["test"][: args.episodes]
    ours = make_engine(cfg, ws.env, model, tokenizer, chat, "cpu")
    plain = RolloutEngine(GenerateBackend(model.policy, chat.pad_token_id), chat, tokenizer, ws.env,
                          RolloutSettings(cfg.env.max_turn_tokens, cfg.env.max_context_tokens))
    results = {}
    for name, engine in (("generate_per_turn", plain), ("agentr1_hf", ours)):
        runs = [run(engine, records, seed=r) for r in range(args.repeats)]
        best = max(runs, key=lambda r: r["action_tokens_per_s"])
        results[name] = {k: round(v, 3) for k, v in best.items()}
    results["speedup_action_tokens_per_s"] = round(
        results["agentr1_hf"]["action_tokens_per_s"] / results["generate_per_turn"]["action_tokens_per_s"], 2)
    results["setup"] = {"episodes": args.episodes, "threads": torch.get_num_threads(),
                        "checkpoint": args.checkpoint or "fresh", "max_turn_tokens": cfg.env.max_turn_tokens}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
