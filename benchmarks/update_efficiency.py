"""How much of this machine's matmul throughput the training steps use.

Measures, in one process and one run:

- the **peaks**: GFLOP/s of a square fp32 and bf16 matmul (``torch.mm``, ``--n`` wide), the
  baseline every other number is read against, and the same at the model's own MLP shape (a
  minibatch's tokens through the up projection): the ceiling this model's steps can be read against;
- the **warm-up steps** as the trainer takes them: a corpus step (next-token loss on every token
  of packed 128-token rows) and a demonstration step (loss on action tokens only, logits
  computed there alone), forward + backward + optimizer step;
- the **PPO update** (:func:`agentr1.rl.ppo.ppo_update`, the default run's epochs and
  minibatches) on a synthetic batch shaped like the default run's episodes;

each in fp32 and under bf16 autocast (``ppo.mixed_precision``), on the config's model: the
default run's (``conf/train.yaml``, built fresh: FLOPs do not depend on the weights) or a
pretrained preset's (``--config conf/smollm2.yaml``: SmolLM2-135M-Instruct after ``make model``,
its ``model.trainable_layers`` frozen below as in training, episodes shaped like its own).
``--profile`` adds where the demonstration step's and the PPO update's CPU time goes, operator by
operator: matmuls, dtype casts, and the elementwise operators that no matmul unit speeds up.

FLOPs per step follow the usual convention, counting only what runs: a forward is
``2·N·tokens`` over the non-embedding weights it passes through, a backward ``4·N·tokens`` over
the trainable ones (none runs below the lowest trainable layer); the tied LM head ``2·d·V`` per
logit position forward, as much again backward for the gradient of the hidden state (twice if
the head is trained); attention ``4·d·T`` per token and layer forward, ``8·d·T`` backward (T the
row's length, counted as if not causal). The PPO update reuses the frozen layers' output that
scoring computed (``ScoredBatch.trunk``), so its forward covers the trainable layers only. Usage::

    python benchmarks/update_efficiency.py [--config conf/train.yaml | conf/smollm2.yaml] [--n 2048] [--steps 10] [--compile] [--profile]
"""
from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

import torch

from agentr1.config import load_config
from agentr1.env.qa.synth import generate
from agentr1.episode import Trajectory
from agentr1.recipe.ppo import ppo_hyper
from agentr1.device import native_bf16
from agentr1.rl.distributed import make_accelerator
from agentr1.rl.guard import StepGuard
from agentr1.rl.ppo import ppo_update, score_batch
from agentr1.rl.sft import sft_loss
from agentr1.rollout.batch import collate
from models.policy import ModelSpec, build_policy, count_parameters, ready_to_train, train_top_layers
from models.pretrained import load_pretrained
from models.tokenizer import build_tokenizer

# Episode shapes (prompt, tokens per turn, observation, turns), measured. The default run's
# (docs/experiments/2026-11-30-learning-to-copy.md, item 5): a 20-token prompt, ~21 action tokens
# in 3 turns of ~7, observations of ~35 tokens between them. SmolLM2's (conf/smollm2.yaml,
# docs/experiments/2026-12-02-smollm2.md): its template's default system turn and the question
# ~60 tokens, turns ~16 (a JSON call in <tool_call> tags), one document of ~50 tokens.
EPISODE = {"scratch": (20, 7, 35, 3), "pretrained": (60, 16, 50, 3)}


def matmul_peak(dtype: torch.dtype, n: int, reps: int = 20, device: torch.device | str = "cpu",
                shape: tuple[int, int, int] | None = None) -> float:
    """GFLOP/s of an n x n x n matmul (or an (m, k) x (k, n) one, ``shape=(m, k, n)``) in ``dtype``
    on ``device`` (best of three timings)."""
    device = torch.device(device)
    m, k, n = shape or (n, n, n)
    # CUDA kernels run asynchronously: wait for them, or the timing covers only the launches.
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n * reps / best / 1e9


def step_flops(model, tokens: int, logit_positions: int, row_len: float, forward_from_trunk: bool = False) -> float:
    """FLOPs of one step over ``tokens`` (module docstring); ``forward_from_trunk``: the frozen
    layers' output is given (the PPO update), so only the trainable layers run forward."""
    cfg = model.policy.config
    d, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    frozen = getattr(model, "frozen_layers", 0) or 0

    def dense(params) -> int:
        return sum(p.numel() for n, p in params if "embed_tokens" not in n and "lm_head" not in n)

    params = list(model.named_parameters())
    trainable = dense((n, p) for n, p in params if p.requires_grad)
    forward = trainable if forward_from_trunk else dense(params)
    forward_layers = layers - frozen if forward_from_trunk else layers
    head_trained = model.policy.get_output_embeddings().weight.requires_grad
    return (2 * forward * tokens + 4 * trainable * tokens
            + (2 + (4 if head_trained else 2)) * d * vocab * logit_positions
            + (4 * forward_layers + 8 * (layers - frozen)) * d * row_len * tokens)


def episode_tokens(shape: tuple[int, int, int, int]) -> int:
    """Tokens in one synthetic episode of ``shape`` (prompt, per turn, observation, turns)."""
    prompt, turn, obs, turns = shape
    return prompt + turn * turns + obs * (turns - 1)


def synthetic_episode(rng: random.Random, vocab: int, rid: int, shape: tuple[int, int, int, int]) -> Trajectory:
    prompt, turn, observation, turns = shape
    ids, mask, ends = [rng.randrange(vocab) for _ in range(prompt)], [0] * prompt, []
    for k in range(turns):
        ids += [rng.randrange(vocab) for _ in range(turn)]
        mask += [1] * turn
        ends.append(len(ids) - 1)
        if k < turns - 1:
            ids += [rng.randrange(vocab) for _ in range(observation)]
            mask += [0] * observation
    logprobs = [-1.0 if m else 0.0 for m in mask]
    return Trajectory(f"x{rid}", ids, mask, logprobs, prompt, ends, [0.2] * turns, float(rng.random() < 0.5))


def make_model(cfg, tokenizer):
    """The config's model as training builds it: fresh from its spec, or the pretrained
    checkpoint with its lower layers frozen (``model.trainable_layers``)."""
    if cfg.model.kind == "pretrained":
        return train_top_layers(load_pretrained(cfg.model.name_or_path)[0], cfg.model.trainable_layers)
    return train_top_layers(build_policy(ModelSpec.from_config(cfg.model), tokenizer, seed=0),
                            cfg.model.trainable_layers)


def timed(fn, steps: int) -> float:
    fn()  # warm-up call: allocator, kernels
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def profile_step(step, precision: str, what: str, steps: int = 3, top: int = 8) -> None:
    """Print the share of ``steps`` calls of ``step``'s CPU time spent in matmuls (mm, bmm,
    addmm: what the peak measures), in dtype casts (``copy_``/``_to_copy``: autocast's bf16
    copies of weights and activations) and in the ``top`` other operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(ops.values())
    matmul_ops, cast_ops = ("aten::mm", "aten::bmm", "aten::addmm"), ("aten::copy_", "aten::_to_copy")
    matmul, casts = (sum(ops.get(k, 0) for k in group) for group in (matmul_ops, cast_ops))
    rest = sorted(((v, k) for k, v in ops.items() if k not in (*matmul_ops, *cast_ops)), reverse=True)
    print(f"\nprofile of the {what} ({'fp32' if precision == 'no' else 'bf16 autocast'}, {steps} steps, "
          f"self CPU time): matmuls {100 * matmul / total:.0f}%, dtype casts {100 * casts / total:.0f}%, "
          + ", ".join(f"{k.removeprefix('aten::')} {100 * v / total:.0f}%" for v, k in rest[:top]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="conf/train.yaml")
    ap.add_argument("--n", type=int, default=2048, help="matmul size of the peak measurement")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    ap.add_argument("--compile", action="store_true",
                    help="also the last precision with each decoder layer compiled, as model.compile: true trains")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the last row's demonstration step and PPO update (bf16 where native, "
                         "compiled with --compile): where their time goes, by operator")
    args = ap.parse_args()
    cfg = load_config(args.config)
    rng = random.Random(0)
    shape = EPISODE[cfg.model.kind]
    if cfg.model.kind == "pretrained":
        tokenizer = load_pretrained(cfg.model.name_or_path)[1]
    else:  # a vocabulary like the default run's (its size is what the FLOPs depend on)
        splits, corpus = generate(0, n_train=2000, n_dev=1, n_test=1, names=cfg.data.synth.names)
        texts = [f"{d.title}\n{d.text}" for d in corpus] + [r.question for r in splits["train"]]
        tokenizer = build_tokenizer(texts, vocab_size=cfg.model.vocab_size)
    probe = make_model(cfg, tokenizer)
    print(f"threads {torch.get_num_threads()}, model {args.config} ({count_parameters(probe) / 1e6:.1f}M parameters, "
          f"{count_parameters(probe, trainable_only=True) / 1e6:.1f}M trainable), vocab {len(tokenizer)}, "
          f"episodes of {episode_tokens(shape)} tokens", flush=True)
    base = getattr(probe, "policy", probe).config
    probe_shape = (episode_tokens(shape), base.hidden_size, base.intermediate_size)
    del probe

    # Without native bf16 (AMX, AVX-512 BF16) a bf16 matmul is emulated: measured small, and the
    # bf16 steps (what ppo.mixed_precision=auto would not choose here) are left out.
    native = native_bf16(torch.device("cpu"))
    bf16_n = args.n if native else 512
    peaks = {"fp32": matmul_peak(torch.float32, args.n), "bf16": matmul_peak(torch.bfloat16, bf16_n)}
    print(f"peak matmul GFLOP/s: fp32 {peaks['fp32']:.0f} ({args.n}^3), bf16 {peaks['bf16']:.0f} ({bf16_n}^3"
          f"{'' if native else ', emulated: this CPU has no AMX or AVX-512 BF16'}) "
          f"({peaks['bf16'] / peaks['fp32']:.2f}x)", flush=True)
    # What the same kernels reach at the model's own widest matmul (a minibatch's tokens through
    # the MLP's up projection): the ceiling a step of this model can be read against.
    mlp = (cfg.sft.batch_size * probe_shape[0], probe_shape[1], probe_shape[2])
    shaped = {k: matmul_peak(dt, 0, shape=mlp) for k, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    print(f"matmul GFLOP/s at the model's MLP shape {mlp[0]}x{mlp[1]}x{mlp[2]}: fp32 {shaped['fp32']:.0f} "
          f"({100 * shaped['fp32'] / peaks['fp32']:.0f}% of its peak), bf16 {shaped['bf16']:.0f} "
          f"({100 * shaped['bf16'] / peaks['bf16']:.0f}% of its peak)", flush=True)

    rows = []
    variants = [(p, False) for p in (("no", "bf16") if native else ("no",))]
    variants += [(variants[-1][0], True)] if args.compile else []
    for precision, compiled in variants:
        model = make_model(cfg, tokenizer)
        ready_to_train(model, torch.device("cpu"), precision, compiled)
        acc = make_accelerator(torch.device("cpu"), precision)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        model, opt = acc.prepare(model, opt)
        vocab, bs = len(tokenizer), cfg.sft.batch_size

        corpus = torch.randint(vocab, (bs, cfg.sft.corpus_block))
        demos = [synthetic_episode(rng, vocab, i, shape) for i in range(bs)]
        demo_ids = torch.tensor([t.token_ids for t in demos])
        demo_target = torch.tensor([t.action_mask[1:] for t in demos], dtype=torch.float)

        def sft_step(ids: torch.Tensor, target: torch.Tensor) -> None:
            with acc.autocast():
                loss, _ = sft_loss(model, ids, torch.ones_like(ids), target)
            acc.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)

        corpus_target = torch.ones(bs, corpus.shape[1] - 1)
        steps = (("warm-up corpus step", corpus, corpus_target),) if cfg.sft.corpus_steps else ()
        for name, ids, target in (*steps, ("warm-up demo step", demo_ids, demo_target)):
            sec = timed(lambda: sft_step(ids, target), args.steps)
            flops = step_flops(acc.unwrap_model(model), ids.numel(), int(target.sum()), ids.shape[1])
            rows.append((name, precision, compiled, sec, ids.numel() / sec, flops / sec / 1e9))
        if args.profile and (precision, compiled) == variants[-1]:
            profile_step(lambda: sft_step(demo_ids, demo_target), precision, "demonstration step")

        hp = ppo_hyper(cfg)
        batch = collate([synthetic_episode(rng, vocab, i, shape) for i in range(cfg.ppo.episodes_per_iter)],
                        tokenizer.pad_token_id or 0)
        with acc.autocast():
            scored, _ = score_batch(model, model, batch, hp)

        # What an iteration's scoring phase does (the reference is the model here), on episodes of
        # 1-3 hops (2-4 turns) as the runs' are: chunks of ppo.score_rows rows longest first, each
        # cut to its longest (the default), beside one pass over the batch padded to its longest.
        prompt, turn, observation, _ = shape
        mixed = collate([synthetic_episode(rng, vocab, i, (prompt, turn, observation, rng.choice((2, 3, 4))))
                         for i in range(cfg.ppo.episodes_per_iter)], tokenizer.pad_token_id or 0)
        for how, score_rows in (("one pass", len(mixed)), (f"chunks of {hp.score_rows or hp.minibatch_size}", None)):
            def score(h=replace(hp, score_rows=score_rows)) -> None:
                with acc.autocast():
                    score_batch(model, model, mixed, h)

            sec = timed(score, max(1, args.steps // 5))
            rows.append((f"PPO scoring ({len(mixed)} episodes of 2-4 turns, {how})", precision, compiled, sec,
                         int(mixed.attention_mask.sum()) / sec, None))
        guard = StepGuard(cfg.max_nonfinite_steps)
        gen = torch.Generator().manual_seed(0)
        sec = timed(lambda: ppo_update(model, opt, acc, batch, scored, hp, gen, guard), max(1, args.steps // 5))
        tokens = int(batch.attention_mask.sum()) * hp.epochs
        flops = step_flops(acc.unwrap_model(model), tokens, int(batch.action_mask.sum()) * hp.epochs,
                           batch.input_ids.shape[1], forward_from_trunk=scored.trunk is not None)
        rows.append((f"PPO update ({hp.epochs} epochs x {cfg.ppo.episodes_per_iter // hp.minibatch_size} mb)",
                     precision, compiled, sec, tokens / sec, flops / sec / 1e9))
        if args.profile and (precision, compiled) == variants[-1]:
            profile_step(lambda: ppo_update(model, opt, acc, batch, scored, hp, gen, guard), precision, "PPO update",
                         steps=1)

    print("\n| step | precision | s/step | tokens/s | GFLOP/s | % of fp32 peak | % of bf16 peak |")
    print("|---|---|---|---|---|---|---|")
    for name, precision, compiled, sec, tps, gflops in rows:
        how = ("fp32" if precision == "no" else "bf16 autocast") + (", compiled layers" if compiled else "")
        if gflops is None:  # no FLOP count for this row
            print(f"| {name} | {how} | {sec:.3f} | {tps:,.0f} | - | - | - |")
            continue
        print(f"| {name} | {how} | {sec:.3f} | {tps:,.0f} | "
              f"{gflops:.0f} | {100 * gflops / peaks['fp32']:.0f}% | {100 * gflops / peaks['bf16']:.0f}% |")


if __name__ == "__main__":
    main()
