"""The default warm-up's demonstration step, eager against ``torch.compile``, side by side.

Why: the warm-up is about half of ``make run`` (~280 of ~540 s on a quiet 2-core VM: 1,200
steps of the default model, conf/train.yaml), and issue 30 asks for the whole run in 300 s.
bf16 is no lever on a CPU without native bf16 (AMX, AVX-512 BF16: ``agentr1.device.native_bf16``), so
this measures what compiling the model's forward (inductor) does to the same step.

Each mode runs in a fresh process (a compiled graph is per process), one after the other in one
run: the default model (``ModelSpec`` of conf/train.yaml) with the warm-up's optimizer (Muon +
AdamW), or with ``--config`` a pretrained preset's (SmolLM2: its top layers on the frozen trunk,
AdamW, at the precision ``ppo.mixed_precision`` resolves to), on batches of ``sft.batch_size`` synthetic demonstrations shaped like the default run's
(``update_efficiency.EPISODE``), with 2 to 4 turns so that the padded length and the number of
action tokens vary from batch to batch as they do in training. It prints each mode's first step
(compilation included), the median of the timed steps after ``--skip`` untimed ones, the loss
after the last step (compiled code rounds differently, so close, not equal) and the step against
eager's. Usage::

    python benchmarks/warmup_step.py [--steps 40] [--modes eager compile compile-dynamic] [--config conf/smollm2.yaml]

``benchmarks/threads.py`` times the same step (``child``) under load, per threading setting.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {"eager": None, "compile": {}, "compile-dynamic": {"dynamic": True}, "compile-layers": "layers"}
"""Name -> ``torch.compile`` keyword arguments for the whole model (None: not compiled;
``"layers"``: each decoder layer, as ``model.compile: true`` trains, :func:`models.policy.compile_layers`)."""
BATCHES = 6
"""Distinct batches the steps cycle through (their shapes differ)."""


def child(mode: str, steps: int, skip: int = 2, config: str = "conf/train.yaml") -> None:
    """Time ``skip + steps`` warm-up steps in ``mode`` of ``config``'s model; print one JSON line."""
    import random

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentr1.config import load_config
    from agentr1.device import ThreadGovernor
    from agentr1.rl.distributed import make_accelerator
    from agentr1.rl.optim import MuonWithAdamW, muon_groups
    from agentr1.rl.sft import pad_episodes, sft_loss
    from benchmarks.update_efficiency import EPISODE, make_model, synthetic_episode
    from models.policy import ActorCritic, ModelSpec, attention_for_precision, compile_layers
    from models.pretrained import load_pretrained

    cfg = load_config(config)
    torch.manual_seed(0)
    acc = make_accelerator(torch.device("cpu"), cfg.ppo.mixed_precision)  # the warm-up trains at the PPO precision
    if cfg.model.kind == "pretrained":  # its trainable_layers on top of the frozen trunk, as training has them
        model = make_model(cfg, load_pretrained(cfg.model.name_or_path)[1]).train()
        attention_for_precision(model, torch.device("cpu"), acc.mixed_precision)
    else:
        spec = ModelSpec.from_config(cfg.model)
        config = Qwen2Config(vocab_size=cfg.model.vocab_size, hidden_size=spec.hidden_size,
                             intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
                             num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                             tie_word_embeddings=True, initializer_range=spec.init_std)
        model = ActorCritic(Qwen2ForCausalLM(config)).train()
    vocab = model.policy.config.vocab_size
    opt = (MuonWithAdamW(muon_groups(model, cfg.sft.muon_lr, cfg.sft.lr, 0.0)) if cfg.sft.optimizer == "muon" else
           torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=cfg.sft.lr, weight_decay=0.0))
    forward = model
    if MODES[mode] == "layers":
        compile_layers(model)
    elif MODES[mode] is not None:
        forward = torch.compile(model, **MODES[mode])
    rng = random.Random(0)
    prompt, turn, observation, _ = EPISODE["pretrained" if cfg.model.kind == "pretrained" else "scratch"]
    batches = []
    for b in range(BATCHES):
        demos = [synthetic_episode(rng, vocab, i, (prompt, turn, observation, 2 + (b + i) % 3))
                 for i in range(cfg.sft.batch_size)]
        batches.append(pad_episodes([(t.token_ids, t.action_mask) for t in demos], 0))
    times, loss = [], None
    governor = ThreadGovernor()  # as the warm-up has it: on with AGENTR1_OMP_WAIT=adapt
    for step in range(skip + steps):
        ids, attention, target = batches[step % BATCHES]
        t0 = time.perf_counter()
        with acc.autocast():
            loss, _ = sft_loss(forward, ids, attention, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        governor.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"mode": mode, "threads": torch.get_num_threads(), "thread_changes": governor.changes,
                      "first_s": times[0],
                      "untimed_s": sum(times[:skip]), "times": times[skip:], "loss": float(loss)}))


def measure(mode: str, steps: int, skip: int, env: dict | None = None, config: str = "conf/train.yaml") -> dict:
    """``child`` in a fresh process, through ``import agentr1`` as every entry point starts (that
    is where ``agentr1/device.py`` sets the OpenMP wait policy)."""
    code = f"import agentr1\nfrom benchmarks.warmup_step import child\nchild({mode!r}, {steps}, {skip}, {config!r})"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per mode")
    ap.add_argument("--skip", type=int, default=2 * BATCHES,
                    help="untimed steps first (compilation, and a recompile per new shape)")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--config", default="conf/train.yaml",
                    help="whose model and warm-up settings (conf/smollm2.yaml: SmolLM2 after make model)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before the run", flush=True)
    rows = []
    for mode in args.modes:
        res = measure(mode, args.steps, args.skip, config=args.config)
        rows.append(res)
        print(f"{mode}: first step {res['first_s']:.1f} s, {args.skip} untimed {res['untimed_s']:.1f} s, "
              f"median {statistics.median(res['times']):.3f} s, loss {res['loss']:.4f}", flush=True)
    base = next((statistics.median(r["times"]) for r in rows if r["mode"] == "eager"), None)
    print("\n| mode | torch threads | first step (s) | untimed steps (s) | median step (s) | x eager | loss after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        med = statistics.median(r["times"])
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"| {r['mode']} | {r['threads']} | {r['first_s']:.1f} | {r['untimed_s']:.1f} | {med:.3f} | {ratio} "
              f"| {r['loss']:.4f} |")


if __name__ == "__main__":
    main()
