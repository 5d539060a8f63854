"""The supervised warm-up: the environment's demonstrator plays the training questions, a model
(from scratch, with a tokenizer trained on the run's text, or pretrained) learns them, and the
value head is fitted to their returns. ``output_dir/warmup`` is the result, and the PPO reference."""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from agentr1.config import Config
from agentr1.device import ThreadGovernor
from agentr1.data.records import DataError, QARecord, load_corpus_dir, split_path
from agentr1.env.base import Environment, NoDemonstrations
from agentr1.env.episodes import run_episodes
from agentr1.episode import Trajectory
from agentr1.fsutil import verify_manifest, write_json
from agentr1.recipe.workspace import MetricsFn, Workspace, seed_everything
from agentr1.rl.distributed import make_accelerator
from agentr1.rl.guard import StepGuard, assert_finite_outputs
from agentr1.rl.optim import MuonWithAdamW, cosine_schedule, muon_groups
from agentr1.rl.sft import fit_value_head, ids_and_masks, pack_documents, pad_episodes, sft_loss, value_fit_batches
from agentr1.rollout.batch import length_bucketed_batches
from agentr1.rundir import WARMUP_DIR, WARMUP_STATS, check_same_config, warmup_identity

log = logging.getLogger("agentr1.train")

WARMUP_PROGRESS_S = 20.0  # a warm-up progress line at least this often (the warm-up is the longest stage)


def play_demonstrations(cfg: Config, ws: Workspace, n: int) -> tuple[list[QARecord], list[Trajectory]]:
    """``n`` episodes of the environment's demonstrator over the train split (cycled if it is
    smaller), as text: :func:`encode_demonstrations` adds the ids."""
    agent = ws.env.demonstrator(cfg.sft.expert, cfg.seed)
    train = ws.split("train")
    records = [train[i % len(train)] for i in range(n)]
    return records, run_episodes(ws.env, agent, records)


TOKENIZER_MAX_DOCS = 20_000
TOKENIZER_MAX_EPISODES = 5_000


def demonstrations_needed(cfg: Config) -> int:
    """How many expert episodes the warm-up must play: all of ``sft.episodes`` when it trains
    on them; with ``sft.steps=0`` only those the from-scratch tokenizer and the value fit read
    (none for a pretrained model without a value fit)."""
    sft = cfg.sft
    if sft.steps:
        return sft.episodes
    tokenizer = TOKENIZER_MAX_EPISODES if cfg.model.kind == "scratch" else 0
    return min(sft.episodes, max(tokenizer, sft.value_fit_episodes))


def check_demonstrable(cfg: Config, ws: Workspace) -> None:
    """Refuse, before anything is written, a warm-up whose environment cannot demonstrate the
    training data (a DataError naming the record; for an environment without a demonstrator, what
    to do instead). A finished warm-up of this config, or none needed, passes."""
    if not demonstrations_needed(cfg) or finished_warmup(cfg) is not None:
        return
    try:
        ws.env.check_demonstrable(ws.split("train"), split_path(ws.data_dir, "train"))
    except NoDemonstrations as err:
        raise DataError(split_path(ws.data_dir, "train"), None, None, str(err)) from None


def tokenizer_texts(ws: Workspace, records, demos) -> list[str]:
    """What the from-scratch tokenizer is trained on: the corpus, every question, and the
    expert episodes rendered exactly as the policy will see them (chat scaffolding, tool calls,
    tool responses), so frequent scaffolding becomes whole tokens."""
    from models.chat import ChatFormat
    from models.tokenizer import build_tokenizer

    # A sample is enough for a 2k vocabulary and keeps BPE training to seconds: the corpus is
    # stored shuffled, so its head is a fair sample.
    texts = [f"{d.title}\n{d.text}" for d in load_corpus_dir(ws.data_dir)[:TOKENIZER_MAX_DOCS]]
    for split in ws.splits.values():
        texts += [ws.env.user_prompt(r) for r in split[:TOKENIZER_MAX_EPISODES]]
    # Rendering needs only the chat template, not a good vocabulary: a byte-level draft does.
    draft = ChatFormat(build_tokenizer(texts[:200], vocab_size=300), ws.tools)
    for r, t in zip(records[:TOKENIZER_MAX_EPISODES], demos):
        parts = [draft.prompt_text(ws.env.system_turn(r), ws.env.user_prompt(r))]
        for k, turn in enumerate(t.turn_texts):
            parts.append(turn)
            if k < len(t.observations):
                parts.append(draft.observation_text(t.observations[k], turn_closed=False))
        texts.append("".join(parts))
    return texts


def build_model(cfg: Config, ws: Workspace, records, demos):
    """A fresh policy (scratch) or a pretrained one, with its tokenizer and chat format."""
    from models.chat import ChatFormat
    from models.policy import train_top_layers

    if cfg.model.kind == "pretrained":
        from models.pretrained import LoraSpec, load_pretrained

        lora = LoraSpec(r=cfg.model.lora_r, alpha=cfg.model.lora_alpha) if cfg.model.lora_r else None
        model, tokenizer = load_pretrained(cfg.model.name_or_path, lora=lora)
        train_top_layers(model, cfg.model.trainable_layers)
    else:
        from models.policy import ModelSpec, build_policy
        from models.tokenizer import build_tokenizer

        tokenizer = build_tokenizer(tokenizer_texts(ws, records, demos), vocab_size=cfg.model.vocab_size,
                                    phrases=ws.env.tokenizer_phrases())
        model = train_top_layers(build_policy(ModelSpec.from_config(cfg.model), tokenizer, seed=cfg.seed),
                                 cfg.model.trainable_layers)
    return model, tokenizer, ChatFormat(tokenizer, ws.tools)


def corpus_rows(ws: Workspace, tokenizer, block: int) -> torch.Tensor | None:
    """The documents that support training questions, tokenised and packed into rows of
    ``block`` tokens (end-of-turn between documents), for the warm-up's corpus steps; None
    where they do not fill one row (a plug-in's environment without a corpus).

    Dev and test questions' documents are left out: the model learns to read and copy from
    text, never the facts it will be asked about.
    """
    wanted = {d for r in ws.split("train") for d in r.supporting_docs}
    texts = [d.text for d in load_corpus_dir(ws.data_dir) if d.id in wanted]
    docs = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    if sum(len(d) + 1 for d in docs) < block:
        return None
    return pack_documents(docs, block, tokenizer.eos_token_id)


def encode_demonstrations(chat, env: Environment, records, demos: list[Trajectory]) -> list[Trajectory]:
    """Fill in each played demonstration's ids, action mask, prompt length and turn ends, every
    piece encoded exactly as in a rollout (``chat.encode_episodes``)."""
    if not demos:
        return demos
    encoded = chat.encode_episodes([(env.system_turn(r), env.user_prompt(r), t.turn_texts, t.observations)
                                    for r, t in zip(records, demos)])
    for t, (ids, mask) in zip(demos, encoded):
        t.token_ids, t.action_mask, t.prompt_len = ids, mask, mask.index(1)
        t.turn_ends = [j for j, m in enumerate(mask) if m and (j + 1 == len(mask) or not mask[j + 1])]
    return demos


def warmup(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None):
    """Supervised warm-up on noisy-expert transcripts; saves and returns (model, tokenizer, chat)."""
    from models.policy import ready_to_train, save_actor_critic

    seed_everything(cfg.seed)
    t0 = time.time()
    # Playing the demonstrations takes a while before the first training step: say so.
    log.info("warm-up: playing %d demonstration episodes (%s environment)", demonstrations_needed(cfg), cfg.env.kind)
    records, demos = play_demonstrations(cfg, ws, demonstrations_needed(cfg))
    expert_em = sum(t.metrics["em"] for t in demos) / len(demos) if demos else None
    model, tokenizer, chat = build_model(cfg, ws, records, demos)
    demos = encode_demonstrations(chat, ws.env, records, demos)
    if demos:
        log.info("warm-up: %d expert episodes (expert EM %.3f), %.1f action tokens/episode, built in %.1fs",
                 len(demos), expert_em, np.mean([t.n_action_tokens for t in demos]), time.time() - t0)
        if cfg.reward.process_enabled and cfg.reward.process_new_support and \
                not any(t.metrics.get("retrieval_hit") for t in demos):
            log.warning("warm-up: no demonstration found a gold key (support recall 0 in all %d): the tools return "
                        "no keys that match the records' supporting_docs (a plain string has none; ToolOutput(text, "
                        "keys) gives them), so reward.process_new_support never pays and RL learns from the outcome "
                        "and the per-call terms alone (docs/add-a-tool.md)", len(demos))

    sft = cfg.sft
    corpus_steps = sft.corpus_steps if cfg.model.kind == "scratch" else 0
    rows = corpus_rows(ws, tokenizer, sft.corpus_block) if corpus_steps else None
    if corpus_steps and rows is None:
        log.warning("warm-up: sft.corpus_steps=%d skipped: the training questions' supporting documents "
                    "do not fill one row of %d tokens (no corpus)", corpus_steps, sft.corpus_block)
        corpus_steps = 0
    if rows is not None:
        log.info("warm-up: %d corpus steps on %d rows of %d tokens, then %d steps on the demonstrations",
                 corpus_steps, len(rows), sft.corpus_block, sft.steps)
    total = corpus_steps + sft.steps
    acc = make_accelerator(ws.device, cfg.ppo.mixed_precision)
    if compiled := ready_to_train(model, ws.device, acc.mixed_precision, cfg.model.compile):
        log.info("warm-up: %d decoder layers compiled (model.compile): the first steps wait for it", compiled)
    optimizer = (MuonWithAdamW(muon_groups(model, sft.muon_lr, sft.lr, sft.weight_decay))
                 if sft.optimizer == "muon" else
                 torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=sft.weight_decay))
    scheduler = cosine_schedule(optimizer, sft.warmup_steps, total, sft.warmdown_ratio)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    model.train()
    gen = torch.Generator().manual_seed(cfg.seed)
    batches = iter(())
    metrics = {"sft/loss": float("nan"), "sft/token_acc": float("nan")}  # sft.steps=0: no warm-up
    guard = StepGuard(cfg.max_nonfinite_steps)
    governor = ThreadGovernor()  # fewer threads while other programs keep the cores busy
    # A logged line, not a progress bar: a bar is silent when stderr is not a terminal (CI, the
    # Prefect pipeline) and never reaches the Prefect task log; this does both.
    loop_start = last_report = time.time()
    for step in range(total):
        on_corpus = step < corpus_steps
        if on_corpus:  # next-token loss on every token of packed documents
            ids = rows[torch.randint(len(rows), (sft.batch_size,), generator=gen)].to(ws.device)
            attn, target = torch.ones_like(ids), torch.ones(ids.shape[0], ids.shape[1] - 1, device=ws.device)
        else:
            idx = next(batches, None)
            if idx is None:
                batches = iter(length_bucketed_batches([len(t.token_ids) for t in demos], sft.batch_size, gen))
                idx = next(batches)
            ids, attn, target = (x.to(ws.device)
                                 for x in pad_episodes(ids_and_masks([demos[i] for i in idx]), chat.pad_token_id))
        with acc.autocast():
            loss, metrics = sft_loss(model, ids, attn, target)
        prefix = "sft/corpus_" if on_corpus else "sft/"
        if on_corpus:
            metrics = {prefix + k.removeprefix("sft/"): v for k, v in metrics.items()}
        guard.where = f"warm-up step {step + 1}/{total}"
        loss_v, grad_norm = float(loss.detach()), None
        if math.isfinite(loss_v):
            acc.backward(loss)
            grad_norm = float(acc.clip_grad_norm_(model.parameters(), 1.0))
        if guard.ok(loss_v, grad_norm):
            optimizer.step()
        scheduler.step()  # the schedule follows the step count, taken or skipped
        optimizer.zero_grad(set_to_none=True)
        governor.step()
        now = time.time()
        if now - last_report >= WARMUP_PROGRESS_S or step == total - 1:
            last_report = now
            done = step + 1
            log.info("warm-up step %d/%d  %s %.3f  token acc %.3f  %.0fs, ~%.0fs left", done, total,
                     "corpus loss" if on_corpus else "loss", metrics[prefix + "loss"],
                     metrics[prefix + "token_acc"], now - t0, (now - loop_start) / done * (total - done))
        if log_metrics and (step % 20 == 0 or step == total - 1):
            log_metrics({**metrics, "sft/lr": scheduler.get_last_lr()[0],
                         "sft/skipped_steps": float(guard.skipped), "perf/threads": float(governor.threads)}, step)
    model = acc.unwrap_model(model)
    model.eval()
    if total:
        with acc.autocast():
            assert_finite_outputs(model, ids, attn, f"warm-up (after {total} steps)")
    value_r2 = None
    if sft.value_fit_episodes:
        n = min(sft.value_fit_episodes, len(demos))
        with acc.autocast():  # the trunk's forward passes at the training precision (bf16: ~3x faster)
            value_r2 = fit_value_head(model, value_fit_batches(demos[:n], chat.pad_token_id, ws.device))
        log.info("warm-up: value head fitted to %d demonstrations' returns, R^2 %.3f", n, value_r2)
    out = Path(cfg.output_dir) / WARMUP_DIR
    save_actor_critic(model, tokenizer, out)
    # Written last: a warm-up directory is complete (and reusable) once its stats are there.
    stats = {"expert_em": expert_em, "episodes": len(demos), "steps": sft.steps, "corpus_steps": corpus_steps,
             "value_fit_r2": value_r2, "skipped_steps": guard.skipped, "seconds": time.time() - t0,
             "final_loss": metrics.get("sft/loss", float("nan")), "config": warmup_identity(cfg)}
    write_json(out / WARMUP_STATS, stats)
    log.info("warm-up done in %.1fs: loss %.3f, token acc %.3f", time.time() - t0,
             metrics.get("sft/loss", float("nan")), metrics.get("sft/token_acc", float("nan")))
    return model, tokenizer, chat


def finished_warmup(cfg: Config) -> Path | None:
    """``output_dir/warmup`` when a finished warm-up of this configuration is there (reuse it),
    None when there is none or only an unfinished one (train it again); a finished warm-up made
    with another configuration is an error naming the keys that differ."""
    out = Path(cfg.output_dir) / WARMUP_DIR
    stats = out / WARMUP_STATS
    if not stats.exists():
        return None
    verify_manifest(out, f"delete {out} to warm up again")
    recorded = json.loads(stats.read_text()).get("config")
    check_same_config(recorded and warmup_identity(cfg, recorded), warmup_identity(cfg), out,
                      f"use another output_dir, or delete {out} to warm up again")
    return out
