"""A pretrained model's training step with each attention kernel, side by side.

Why: a SmolLM2 warm-up step on BFCL prompts (8 x 500-700 tokens) took 10-19 s on one core with
eager attention everywhere, the rule that ``models.policy.attention_for_precision`` applied to
every model under bf16 on a CPU (measured for the from-scratch model, whose 32-wide heads make
SDPA's bf16 backward 2x slower than eager's). This times one step (the forward through every
layer, the backward through the trainable top ones) of the real model with the frozen trunk and
the trainable layers each on eager or SDPA, at the lengths the presets train on, in bf16
autocast as the presets do; the first row of each length is the old rule (eager everywhere).

    python benchmarks/attention.py [--model model-cache/SmolLM2-135M-Instruct] [--lengths 200 500 700]
                                   [--batch 8] [--trainable 8] [--repeats 3]

Prints one JSON line per (length, trunk kernel, top kernel): the median forward and backward
seconds over ``--repeats`` steps and the step against the old rule's. Random token ids (the
kernels' cost does not depend on which tokens), one padded row per batch like a real one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def step_seconds(model, ids, attn, at, trunk_kernel: str, top_kernel: str, repeats: int) -> tuple[float, float]:
    """Median (forward, backward) seconds of the loss on the positions ``at``."""
    import torch

    lm = model.policy
    params = [p for p in model.parameters() if p.requires_grad]
    fwd, bwd = [], []
    for _ in range(repeats + 1):  # the first is a warm-up of the kernels
        lm.config._attn_implementation = top_kernel
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            kept = lm.config._attn_implementation
            lm.config._attn_implementation = trunk_kernel
            with torch.no_grad():
                trunk = model.trunk_states(ids, attn) if trunk_kernel == "sdpa" else _eager_trunk(model, ids, attn)
            lm.config._attn_implementation = kept
            logits, _ = model(ids, attn, logits_at=at, trunk=trunk)
            loss = torch.nn.functional.cross_entropy(logits.float(), ids[at])
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        for p in params:
            p.grad = None
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    return statistics.median(fwd[1:]), statistics.median(bwd[1:])


def _eager_trunk(model, ids, attn):
    """The frozen layers' output with eager attention (what the old rule ran)."""
    from models.policy import _base_lm, run_decoder_layers

    base = _base_lm(model.policy).model
    return run_decoder_layers(base, base.embed_tokens(ids), attn, None, 0, model.frozen_layers, final_norm=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="model-cache/SmolLM2-135M-Instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 500, 700])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--trainable", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--action-tokens", type=int, default=50, help="positions with a loss, at each row's end")
    args = parser.parse_args()

    import torch

    from models.policy import train_top_layers
    from models.pretrained import load_pretrained

    model, _ = load_pretrained(args.model)
    train_top_layers(model, args.trainable)
    model.train()
    gen = torch.Generator().manual_seed(0)
    for length in args.lengths:
        ids = torch.randint(100, 40_000, (args.batch, length), generator=gen)
        attn = torch.ones_like(ids)
        attn[-1, length * 3 // 4:] = 0  # one shorter row, as in a padded batch
        at = torch.zeros_like(ids, dtype=torch.bool)
        at[:, length - args.action_tokens - 1: length - 1] = True
        at &= attn.bool()
        base = None
        for trunk_kernel, top_kernel in (("eager", "eager"), ("sdpa", "eager"), ("sdpa", "sdpa")):
            f, b = step_seconds(model, ids, attn, at, trunk_kernel, top_kernel, args.repeats)
            base = base or f + b
            print(json.dumps({"length": length, "batch": args.batch, "trunk": trunk_kernel, "top": top_kernel,
                              "forward_s": round(f, 3), "backward_s": round(b, 3), "step_s": round(f + b, 3),
                              "vs_eager": round((f + b) / base, 3), "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
