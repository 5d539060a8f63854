"""The training recipe: data -> supervised warm-up -> masked-PPO iterations -> evaluation.

Each stage is a function that takes the resolved :class:`~agentr1.config.Config` and paths, so the
Prefect tasks (``tasks/``) and the CLI call the same code. Metrics go to an optional
``log_metrics(metrics, step)`` callback (MLflow in the pipeline), never imported here.

Run layout under ``cfg.output_dir``::

    warmup/            HF directory + value head of the warmed-up policy (the PPO reference)
    checkpoints/last/  the latest PPO checkpoint (policy, optimizer, scheduler, RNG, iteration)
    checkpoints/best/  with ``ppo.dev_every``: the policy that scored best on dev, and best.json
    final/             the trained policy (the best on dev, or the last)
    metrics.jsonl      one JSON object of metrics per PPO iteration
    eval_*.json        evaluation metrics; trajectories_*.txt  rendered sample episodes
"""
from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import gather_object

from agentr1 import checkpoint as ckpt
from agentr1.config import TRAIN_STAGES, Config, ConfigError
from agentr1.data.convert import DEFAULT_DEV_FRACTION, DEFAULT_TEST_FRACTION, SYNTHETIC, convert_to_dataset
from agentr1.data.records import (DataError, QARecord, generation_needed, load_corpus_dir, load_dataset, split_path,
                                  write_dataset)
from agentr1.env.base import Environment, NoDemonstrations
from agentr1.env.episodes import run_episodes
from agentr1.env.registry import build_env, synth_data
from agentr1.episode import Trajectory
from agentr1.metrics import HEADLINE_KEYS
from agentr1.errors import UserError
from agentr1.evaluate import EvalResult, evaluate, render_trajectory
from agentr1.fsutil import recover_dir, verify_manifest, write_json
from agentr1.rl.control import DEV_SCORE, adapt_kl_coef, dev_score, lr_warmup_factor, stop_reason
from agentr1.rl.guard import StepGuard, TrainingDiverged, assert_finite_outputs
from agentr1.rl.distributed import launched_processes, make_accelerator, native_bf16
from agentr1.rl.optim import MuonWithAdamW, cosine_schedule, muon_groups
from agentr1.rl.ppo import PPOHyper, ppo_update, score_batch
from agentr1.rl.sft import fit_value_head, ids_and_masks, pack_documents, pad_episodes, sft_loss, value_fit_batches
from agentr1.rollout.backend import HFBackend
from agentr1.rollout.batch import collate, length_bucketed_batches
from agentr1.rollout.checks import RolloutBatchError, check_batch, reward_bound
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from agentr1.rundir import (CURVE_FILE, HISTORY_FILE, SUMMARY_FILE, check_same_config, claim_run_dir,
                            ppo_identity, warmup_identity)

log = logging.getLogger("agentr1.train")

WARMUP_DIR = "warmup"
WARMUP_STATS = "warmup_stats.json"
WARMUP_PROGRESS_S = 20.0  # a warm-up progress line at least this often (the warm-up is the longest stage)
FINAL_DIR = "final"
LAST_DIR = Path("checkpoints") / "last"
BEST_DIR = Path("checkpoints") / "best"
BEST_FILE = "best.json"
SELECTED_FILE = "selected.json"

MetricsFn = Callable[[dict[str, float], int], None]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def ensure_data(cfg: Config, source: str = SYNTHETIC, input_path: str | None = None,
                fractions: tuple[float, float] = (DEFAULT_DEV_FRACTION, DEFAULT_TEST_FRACTION)) -> Path:
    """The dataset directory, made there only when the directory does not exist or is an
    incomplete one agentr1 generated (marker): the environment's synthetic world, or ``input_path``
    converted by ``source`` (a ``SOURCE_KINDS`` converter) into train/dev/test by ``fractions``
    (dev, test). Any other directory is left as it is for the loader to judge: an incomplete one
    is refused, naming what is missing."""
    data_dir = Path(cfg.data.dir)
    if not generation_needed(data_dir):
        return data_dir
    if source != SYNTHETIC:
        if not input_path:
            raise ValueError(f"data source {source!r} needs an input file (data.input)")
        convert_to_dataset(source, input_path, data_dir, fractions=fractions)
    else:
        log.info("generating the %s environment's synthetic data (seed %d) into %s",
                 cfg.env.kind, cfg.data.synth.seed, data_dir)
        generated = synth_data(cfg)
        if generated is None:
            raise DataError(data_dir, None, None, f"no dataset here, and the {cfg.env.kind!r} environment has no "
                            "generator: give data.dir a dataset (qa/{train,dev,test}.jsonl, corpus.jsonl)")
        splits, corpus, *files = generated  # a generator may add files: (splits, corpus, {name: bytes})
        write_dataset(data_dir, splits, corpus, files=files[0] if files else None)
    return data_dir


@dataclass
class Workspace:
    """Data, environment (with its tools) and device, built once and shared by the stages (and by
    the runs of an ablation). It holds no config: every stage reads its own ``cfg``, the one
    place its settings come from."""

    data_dir: Path
    splits: dict[str, list[QARecord]]
    env: Environment
    device: torch.device
    tools_in_prompt: bool = False
    """``env.tools_in_prompt`` of the config it was built from: part of the environment."""

    @property
    def tools(self) -> list[dict] | None:
        """Tool schemas for the chat template, or None when the prompt leaves them out."""
        return self.env.tools if self.tools_in_prompt else None

    def split(self, name: str) -> list[QARecord]:
        """The records of split ``name``; a :class:`DataError` naming the missing file when the
        dataset has no such split (a converted dataset may hold only ``dev``)."""
        if name not in self.splits:
            raise DataError(split_path(self.data_dir, name), None, None,
                            f"no {name} split (the dataset has {sorted(self.splits)})")
        return self.splits[name]

    @classmethod
    def build(cls, cfg: Config) -> "Workspace":
        data_dir = ensure_data(cfg)
        splits, _ = load_dataset(data_dir)  # the one schema check: bad data stops here, before any write
        return cls(data_dir, splits, build_env(cfg, data_dir), resolve_device(cfg), cfg.env.tools_in_prompt)


def make_engine(cfg: Config, env: Environment, model, tokenizer, chat, device) -> RolloutEngine:
    from agentr1.rollout.vllm_backend import VLLMBackend, resolve_backend

    if resolve_backend(cfg.rollout.backend, model.policy, device) == "vllm":
        dtype = torch.bfloat16 if cfg.rollout.dtype == "bf16" else None
        if dtype is not None and not native_bf16(device):
            log.warning("rollout.dtype=bf16 on a device without native bf16 (a CPU without AMX or AVX-512 BF16): "
                        "vLLM samples in emulated bf16, far slower than fp32 here; rollout.dtype=auto samples in fp32")
        backend = VLLMBackend(model.policy, device, max_model_len=cfg.env.max_context_tokens, seed=cfg.seed,
                              dtype=dtype)
    elif cfg.rollout.dtype != "auto":
        raise ConfigError(f"rollout.dtype={cfg.rollout.dtype}: the hf backend samples from the trainer's own "
                          "weights; use rollout.backend=vllm (make setup installs its CPU build) or rollout.dtype=auto")
    else:
        backend = HFBackend(model.policy, chat.pad_token_id, device)
    settings = RolloutSettings(cfg.env.max_turn_tokens, cfg.env.max_context_tokens,
                               cfg.rollout.temperature, cfg.rollout.top_p)
    return RolloutEngine(backend, chat, tokenizer, env, settings)


# ----------------------------------------------------------------------------- warm-up


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
        parts = [draft.prompt_text(ws.env.system_turn(), ws.env.user_prompt(r))]
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


def corpus_rows(ws: Workspace, tokenizer, block: int) -> torch.Tensor:
    """The documents that support training questions, tokenised and packed into rows of
    ``block`` tokens (end-of-turn between documents), for the warm-up's corpus steps.

    Dev and test questions' documents are left out: the model learns to read and copy from
    text, never the facts it will be asked about.
    """
    wanted = {d for r in ws.split("train") for d in r.supporting_docs}
    texts = [d.text for d in load_corpus_dir(ws.data_dir) if d.id in wanted]
    docs = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return pack_documents(docs, block, tokenizer.eos_token_id)


def encode_demonstrations(chat, env: Environment, records, demos: list[Trajectory]) -> list[Trajectory]:
    """Fill in each played demonstration's ids, action mask, prompt length and turn ends, every
    piece encoded exactly as in a rollout (``chat.encode_episodes``)."""
    if not demos:
        return demos
    system = env.system_turn()
    encoded = chat.encode_episodes([(system, env.user_prompt(r), t.turn_texts, t.observations)
                                    for r, t in zip(records, demos)])
    for t, (ids, mask) in zip(demos, encoded):
        t.token_ids, t.action_mask, t.prompt_len = ids, mask, mask.index(1)
        t.turn_ends = [j for j, m in enumerate(mask) if m and (j + 1 == len(mask) or not mask[j + 1])]
    return demos


def warmup(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None):
    """Supervised warm-up on noisy-expert transcripts; saves and returns (model, tokenizer, chat)."""
    from models.policy import attention_for_precision, save_actor_critic

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
    if rows is not None:
        log.info("warm-up: %d corpus steps on %d rows of %d tokens, then %d steps on the demonstrations",
                 corpus_steps, len(rows), sft.corpus_block, sft.steps)
    total = corpus_steps + sft.steps
    acc = make_accelerator(ws.device, cfg.ppo.mixed_precision)
    attention_for_precision(model, ws.device, acc.mixed_precision)
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
        now = time.time()
        if now - last_report >= WARMUP_PROGRESS_S or step == total - 1:
            last_report = now
            done = step + 1
            log.info("warm-up step %d/%d  %s %.3f  token acc %.3f  %.0fs, ~%.0fs left", done, total,
                     "corpus loss" if on_corpus else "loss", metrics[prefix + "loss"],
                     metrics[prefix + "token_acc"], now - t0, (now - loop_start) / done * (total - done))
        if log_metrics and (step % 20 == 0 or step == total - 1):
            log_metrics({**metrics, "sft/lr": scheduler.get_last_lr()[0],
                         "sft/skipped_steps": float(guard.skipped)}, step)
    model = acc.unwrap_model(model)
    model.eval()
    if total:
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


# ----------------------------------------------------------------------------- PPO


def ppo_hyper(cfg: Config) -> PPOHyper:
    p = cfg.ppo
    return PPOHyper(estimator=p.estimator, loss_mask=p.loss_mask, advantage_mask=p.advantage_mask,
                    loss_weighting=p.loss_weighting, gigpo_step_weight=p.gigpo_step_weight,
                    epochs=p.epochs, minibatch_size=p.minibatch_size, grad_accum=p.grad_accum, clip_eps=p.clip_eps,
                    dual_clip_c=p.dual_clip_c, vf_coef=p.vf_coef, vf_clip=p.vf_clip, kl_coef=p.kl_coef,
                    kl_kind=p.kl_kind, kl_in_reward=p.kl_in_reward, kl_clamp=p.kl_clamp,
                    entropy_coef=p.entropy_coef, gamma=p.gamma, lam=p.lam,
                    whiten_advantages=p.whiten_advantages, max_grad_norm=p.max_grad_norm,
                    temperature=cfg.rollout.temperature)


def iteration_records(train: list[QARecord], n_questions: int, group_size: int, seed: int, iteration: int):
    """The questions of one iteration, each repeated ``group_size`` times; depends only on
    (seed, iteration), so a resumed run sees the same questions."""
    rng = random.Random(seed * 100_003 + iteration)
    picked = rng.sample(train, min(n_questions, len(train)))
    records = [r for r in picked for _ in range(group_size)]
    groups = [g for g in range(len(picked)) for _ in range(group_size)]
    return records, groups


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    n = len(trajs)
    keys = ("em", "f1", "contains", "format_ok", "n_calls", "n_bad_calls", "support_recall", "turns")
    out = {f"rollout/{k}": sum(t.metrics.get(k, 0.0) for t in trajs) / n for k in keys}
    out["reward/outcome"] = sum(t.outcome_reward for t in trajs) / n
    out["reward/process"] = sum(sum(t.process_rewards) for t in trajs) / n
    out["reward/total"] = out["reward/outcome"] + out["reward/process"]
    out["rollout/action_tokens"] = sum(t.n_action_tokens for t in trajs) / n
    out["rollout/length"] = sum(len(t.token_ids) for t in trajs) / n
    return out


def share_frozen_layers(model, ref_model, ref_dir: Path) -> None:
    """Let the reference policy use the policy's frozen layers (``model.trainable_layers``): the
    same modules, not a copy, so PPO computes them once per batch for both. They must hold the
    same weights (a policy never trains them); a reference whose frozen part differs (a warm-up
    that trained those layers is fine: the policy starts from it) is an error."""
    from models.policy import _base_lm

    k = model.frozen_layers
    if not k:
        return
    mine, theirs = _base_lm(model.policy).model, _base_lm(ref_model.policy).model
    pairs = [(mine.embed_tokens, theirs.embed_tokens), *zip(mine.layers[:k], theirs.layers[:k])]
    for a, b in pairs:
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            if not torch.equal(p, q):
                raise ConfigError(f"model.trainable_layers={len(mine.layers) - k}: the reference policy {ref_dir} "
                                  f"differs from the policy below layer {k} ({name}): they cannot share the frozen "
                                  "layers; use the trainable_layers the warm-up was made with")
    for i in range(k):  # the reference's LM head stays its own (it is tied to its embeddings)
        theirs.layers[i] = mine.layers[i]
    ref_model.frozen_layers = k


def check_dev_split(cfg: Config, ws: Workspace) -> None:
    """With ``ppo.dev_every`` (on by default), the dataset must have ``ppo.dev_split``: a
    :class:`DataError` naming the missing file and both ways out."""
    if not cfg.ppo.dev_every:
        return
    try:
        ws.split(cfg.ppo.dev_split)
    except DataError as err:
        raise DataError(err.path, None, None, f"{err.message}; PPO keeps its best policy on this split "
                        f"(ppo.dev_every={cfg.ppo.dev_every}): add the file, name another split with "
                        f"ppo.dev_split=..., or train without it with ppo.dev_every=0") from None


class PPOSession:
    """The state of a PPO run between iterations, opened from disk and saved back.

    Opens from ``output_dir/checkpoints/last`` when it exists (resume; it must have been made
    with the same configuration), else from the warm-up checkpoint. One iteration is
    :meth:`iterate` (collect -> check the batch -> update) then, when due, :meth:`save`;
    everything random in an iteration is seeded by (seed, iteration), so stopping and reopening
    between iterations changes nothing. :func:`run_ppo` is the loop every entry point uses.
    """

    def __init__(self, cfg: Config, ws: Workspace):
        from models.chat import ChatFormat
        from models.policy import attention_for_precision, load_actor_critic, train_top_layers

        self.cfg, self.ws = cfg, ws
        check_dev_split(cfg, ws)  # before anything is loaded, not at the first evaluation
        out = Path(cfg.output_dir)
        self.last = recover_dir(out / LAST_DIR)  # a kill -9 mid-swap leaves the old checkpoint aside
        resume = self.last.exists()
        if not resume and not (out / WARMUP_DIR).exists():
            raise UserError(f"{out / WARMUP_DIR}: no warm-up to start PPO from; run the warm-up first "
                            f"(agentr1 train --stage warmup, or the whole run without --stage)")
        verify_manifest(out / WARMUP_DIR, f"delete {out / WARMUP_DIR} to warm up again")
        if resume:
            verify_manifest(self.last, f"move {self.last} away to restart PPO from the warm-up")
            check_same_config(ckpt.load_state(self.last).get("config"), ppo_identity(cfg), self.last,
                              f"use another output_dir, or delete {self.last} to start PPO again")
        start_dir = self.last / ckpt.POLICY_DIR if resume else out / WARMUP_DIR
        model, self.tokenizer = load_actor_critic(start_dir, device=ws.device)
        train_top_layers(model, cfg.model.trainable_layers)
        self.ref_model, _ = load_actor_critic(out / WARMUP_DIR, device=ws.device)
        self.ref_model.eval().requires_grad_(False)
        share_frozen_layers(model, self.ref_model, out / WARMUP_DIR)
        self.chat = ChatFormat(self.tokenizer, ws.tools)
        p = cfg.ppo
        self.hp = ppo_hyper(cfg)
        self.guard = StepGuard(cfg.max_nonfinite_steps)
        bound = reward_bound(cfg.reward.model_dump(), cfg.env.max_turns)
        self.reward_bounds = (-bound, bound)
        self.acc = make_accelerator(ws.device, p.mixed_precision)
        attention_for_precision(model, ws.device, self.acc.mixed_precision)
        optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=p.lr, weight_decay=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: lr_warmup_factor(it, p.lr_warmup_iters))
        self.iteration, self.history = 0, []
        self.dev_start: float | None = None  # the warm-up's dev score (ppo.dev_patience counts from it)
        if resume:
            state = ckpt.load_trainer_state(self.last)
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            ckpt.set_rng_state(state["rng"])
            self.iteration = state["iteration"]
            saved = ckpt.load_state(self.last)
            self.history, self.dev_start = saved.get("history", []), saved.get("dev_start")
            log.info("resuming PPO at iteration %d (%s)", self.iteration, self.last)
        self.kl_coef = p.kl_coef
        if p.kl_target is not None and self.history:  # the controller's next value, as it was left
            last_it = self.history[-1]
            self.kl_coef = adapt_kl_coef(last_it["actor/kl_coef"], last_it["actor/ref_kl"], p.kl_target, p.kl_horizon)
        self.best = self._recorded_best() if resume else None
        # The per-iteration schedule is stepped by the loop itself, once per iteration: accelerate's
        # wrapper would step it once per process.
        self.model, self.optimizer = self.acc.prepare(model, optimizer)
        self.scheduler = scheduler
        self.engine = make_engine(cfg, ws.env, self.policy, self.tokenizer, self.chat, ws.device)
        self._t_offset = self.history[-1]["time/elapsed_s"] if self.history else 0.0
        self._t_open = time.time()

    @property
    def policy(self):
        """The unwrapped actor-critic (what is saved, evaluated and sampled from)."""
        return self.acc.unwrap_model(self.model)

    @property
    def stopped(self) -> str | None:
        """Why the run stopped before ``ppo.iterations`` (:func:`agentr1.rl.control.stop_reason`), or None."""
        start = -math.inf if self.dev_start is None else self.dev_start
        return stop_reason(self.history, self.cfg.ppo, start)

    @property
    def done(self) -> bool:
        return self.iteration >= self.cfg.ppo.iterations or self.stopped is not None

    def _recorded_best(self) -> dict | None:
        best = Path(self.cfg.output_dir) / BEST_DIR
        if not self.cfg.ppo.dev_every or not best.exists():
            return None
        verify_manifest(best, f"move {best} away to restart PPO from the warm-up")
        record = json.loads((best / BEST_FILE).read_text())
        check_same_config(record.get("config"), ppo_identity(self.cfg), best,
                          f"use another output_dir, or delete {best.parent} to start PPO again")
        return record

    def evaluate_dev(self) -> dict[str, float]:
        """When due (``ppo.dev_every``: before the first iteration, every that many, and at the
        end), the current policy's greedy and sampled episodes on the dev questions, as
        ``dev/...`` metrics with their score (``dev/score``); a better score than any before
        replaces ``checkpoints/best``. {} when not due."""
        p, it = self.cfg.ppo, self.iteration
        if not p.dev_every or (it % p.dev_every and not self.done) or (it == 0 and self.best is not None):
            return {}
        records = self.ws.split(p.dev_split)[: p.dev_examples]
        self.model.eval()
        self.engine.backend.sync_weights(self.policy.policy)  # vllm holds a copy; hf reads the module
        temp = self.cfg.eval.sampled_temperature or self.cfg.rollout.temperature
        result = evaluate(self.engine, records, seed=self.cfg.seed + 23_456, sampled_temperature=temp,
                          batch_size=self.cfg.eval.batch_size)
        score = dev_score(result.metrics, p.dev_metric)
        if it == 0:
            self.dev_start = score
        if self.best is None or score > self.best["score"]:
            self.best = {"iteration": it, "score": score, "metrics": result.metrics, "config": ppo_identity(self.cfg)}
            self._save_best()
        if self.acc.is_main_process:
            log.info("dev %s at iteration %d: %.3f (greedy EM %.3f, sampled EM %.3f); best %.3f at iteration %d",
                     p.dev_metric, it, score, result.metrics["greedy/em"], result.metrics["sampled/em"],
                     self.best["score"], self.best["iteration"])
        return {DEV_SCORE: score, **{f"dev/{k}": v for k, v in result.metrics.items()}}

    def _save_best(self) -> None:
        from models.policy import save_actor_critic

        if self.acc.is_main_process:
            def write(d: Path) -> None:
                save_actor_critic(self.policy, self.tokenizer, d / ckpt.POLICY_DIR)
                write_json(d / BEST_FILE, self.best)

            ckpt.atomic_dir(Path(self.cfg.output_dir) / BEST_DIR, write, manifest=True,
                            need=ckpt.tensor_bytes(self.policy.state_dict()))
        self.acc.wait_for_everyone()

    def collect(self) -> list[Trajectory]:
        """Rollouts of the current policy for this iteration's questions."""
        p = self.cfg.ppo
        records, groups = iteration_records(self.ws.split("train"), p.episodes_per_iter // p.group_size,
                                            p.group_size, self.cfg.seed, self.iteration)
        # Data parallel: each process plays a contiguous share of whole questions (GRPO groups stay
        # together), with its own seeds; then every process gets every trajectory, in order.
        acc = self.acc
        with acc.split_between_processes(sorted(set(groups))) as mine:
            keep = [i for i, g in enumerate(groups) if g in set(mine)]
        self.model.eval()
        t0 = time.time()
        self.engine.backend.sync_weights(self.policy.policy)  # vllm holds a copy; hf reads the module
        seed = self.cfg.seed * 7_777 + self.iteration + RANK_SEED_STRIDE * acc.process_index
        trajs = self.engine.run([records[i] for i in keep], seed=seed,
                                groups=[groups[i] for i in keep]) if keep else []
        self._t_rollout = time.time() - t0
        return gather_object(trajs) if acc.num_processes > 1 else trajs

    def check_sampling(self, trajs: list[Trajectory]) -> None:
        """Non-finite sampling log-probs mean the policy itself has diverged."""
        bad = sum(1 for t in trajs for lp, m in zip(t.rollout_logprobs, t.action_mask) if m and not math.isfinite(lp))
        if bad:
            raise TrainingDiverged(f"PPO iteration {self.iteration + 1}: the policy sampled {bad} tokens with "
                                   "non-finite log-probs: its weights have diverged (nothing was learnt from the batch)")

    def check(self, trajs: list[Trajectory]) -> None:
        """Refuse to learn from a batch that breaks a rollout rule (agentr1.rollout.checks)."""
        if self.cfg.ppo.check_rollouts:
            try:
                check_batch(trajs, self.cfg.env.max_context_tokens, self.reward_bounds)
            except RolloutBatchError as e:
                raise RolloutBatchError(f"PPO iteration {self.iteration + 1}: {e}") from None

    def iterate(self, before_update: BatchHook | None = None) -> dict[str, float]:
        """One iteration: collect -> ``before_update(trajs, iteration)`` (the Prefect task stores
        the batch and validates it with Great Expectations there, for its report) -> check ->
        update. Returns its metrics."""
        trajs = self.collect()
        self.check_sampling(trajs)
        if before_update is not None:
            before_update(trajs, self.iteration + 1)
        self.check(trajs)
        return self.update(trajs)

    def update(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Score, compute advantages and update on ``trajs``; returns this iteration's metrics."""
        p, it = self.cfg.ppo, self.iteration
        where = f"PPO iteration {it + 1}"
        batch = collate(trajs, self.chat.pad_token_id).to(self.ws.device)
        t1 = time.time()
        hp = replace(self.hp, kl_coef=self.kl_coef)
        with self.acc.autocast():
            scored, score_m = score_batch(self.model, self.ref_model, batch, hp, self.acc)
        t_score = time.time() - t1
        if not (math.isfinite(score_m["actor/ref_kl"]) and math.isfinite(score_m["critic/advantages_abs"])):
            raise TrainingDiverged(f"{where}: the batch scores to non-finite log-probs or advantages "
                                   f"(KL to the reference {score_m['actor/ref_kl']}, "
                                   f"|advantage| {score_m['critic/advantages_abs']})")
        self.model.train()
        self.guard.where = where
        lr = self.scheduler.get_last_lr()[0]
        upd_m = ppo_update(self.model, self.optimizer, self.acc, batch, scored, hp,
                           torch.Generator().manual_seed(self.cfg.seed * 31 + it), self.guard)
        self.scheduler.step()
        self.model.eval()
        assert_finite_outputs(self.policy, batch.input_ids, batch.attention_mask, where)
        t_upd = time.time() - t1 - t_score
        t_roll = getattr(self, "_t_rollout", 0.0)
        # An iteration's time in three parts: sampling, scoring (old/reference log-probs, values,
        # advantages), and the epochs of minibatch updates.
        metrics = {**rollout_metrics(trajs), **score_m, **upd_m, "actor/kl_coef": self.kl_coef,
                   "actor/lr": lr,
                   "perf/rollout_s": t_roll, "perf/score_s": t_score, "perf/update_s": t_upd,
                   "perf/iter_s": t_roll + t_score + t_upd,
                   "perf/rollout_action_tokens_per_s": sum(t.n_action_tokens for t in trajs) / max(t_roll, 1e-9),
                   "perf/update_tokens_per_s": int(batch.attention_mask.sum()) * p.epochs / max(t_upd, 1e-9),
                   "time/elapsed_s": self._t_offset + time.time() - self._t_open, "iteration": float(it + 1)}
        self.history.append(metrics)
        self.iteration += 1
        if p.kl_target is not None:
            self.kl_coef = adapt_kl_coef(self.kl_coef, score_m["actor/ref_kl"], p.kl_target, p.kl_horizon)
        if self.acc.is_main_process:  # one line per iteration, not one per process
            log.info("iter %3d/%d  em %.3f  reward %.3f  kl %.4f  clip %.3f  ent %.3f  vf %.4f  %.1fs",
                     it + 1, p.iterations, metrics["rollout/em"], metrics["reward/total"],
                     metrics["actor/ref_kl"], metrics.get("actor/pg_clipfrac", 0), metrics.get("actor/entropy", 0),
                     metrics.get("critic/vf_loss", 0), metrics["perf/iter_s"])
        return metrics

    def save(self) -> Path:
        """Atomically write the checkpoint (policy, optimizer, scheduler, RNG, history, and the
        configuration it was made with); a non-finite policy is refused before anything is written
        (by ``save_actor_critic``, as every write of a policy)."""
        from models.policy import save_actor_critic

        if self.acc.is_main_process:  # every process holds the same weights: one writes them
            ckpt.save_checkpoint(self.last, lambda d: save_actor_critic(self.policy, self.tokenizer, d),
                                 self.optimizer, self.scheduler, self.iteration,
                                 {"history": self.history, "config": ppo_identity(self.cfg),
                                  "dev_start": self.dev_start},
                                 policy_bytes=ckpt.tensor_bytes(self.policy.state_dict()))
        self.acc.wait_for_everyone()
        return self.last


RANK_SEED_STRIDE = 1_000_000_007
"""Offsets each data-parallel process's rollout seed, so processes never sample with the same seeds."""

BatchHook = Callable[[list[Trajectory], int], None]
"""``(trajectories, iteration)`` before an update: store or validate the batch (raise to stop)."""
SessionHook = Callable[[PPOSession], None]


def run_ppo(session: PPOSession, end: int | None = None, log_metrics: MetricsFn | None = None,
            before_update: BatchHook | None = None, save_at: frozenset[int] = frozenset(),
            after_iteration: SessionHook | None = None) -> PPOSession:
    """The PPO loop of every entry point (the CLI and DVC stages, the Prefect flows, the
    ablation runs): iterations until ``end`` (default ``ppo.iterations``) in total, a checkpoint
    every ``ppo.checkpoint_every``, at the iterations in ``save_at`` and at the end, then
    ``after_iteration(session)`` (the ablation measures its learning curve there). With
    ``ppo.dev_every`` the policy is evaluated on dev before the first iteration and on that
    schedule, and the best kept (:meth:`PPOSession.evaluate_dev`); the run ends early when
    :attr:`PPOSession.stopped` gives a reason (``ppo.stop_kl``, ``stop_bad_calls``, ``dev_patience``).

    Under ``accelerate launch`` with several processes (agentr1/rl/distributed.py) every process
    runs this loop; ``log_metrics``, ``before_update`` and ``after_iteration`` run on the main
    process only, which alone writes.

    A diverged run raises :class:`~agentr1.rl.guard.TrainingDiverged` and a bad rollout batch
    :class:`~agentr1.rollout.checks.RolloutBatchError`, both before anything of that iteration
    is saved: the last checkpoint on disk is the last good one.
    """
    end = session.cfg.ppo.iterations if end is None else min(end, session.cfg.ppo.iterations)
    every = session.cfg.ppo.checkpoint_every
    main = session.acc.is_main_process
    first = session.evaluate_dev() if session.iteration == 0 else {}  # the warm-up on dev
    if first and log_metrics and main:
        log_metrics(first, 0)
    while session.iteration < end and not session.done:
        metrics = session.iterate(before_update if main else None)
        metrics.update(session.evaluate_dev())  # the same dict as the history's last entry
        if log_metrics and main:
            log_metrics(metrics, session.iteration)
        it = session.iteration
        if session.stopped and main:
            log.warning("PPO stops early after iteration %d of %d: %s", it, session.cfg.ppo.iterations,
                        session.stopped)
        if (every and it % every == 0) or it == end or it in save_at or session.done:
            session.save()
        if after_iteration is not None and main:
            after_iteration(session)
    return session


def train_ppo(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None,
              stop_after: int | None = None):
    """PPO iterations from the warm-up checkpoint (or the last checkpoint, to resume).

    ``stop_after`` ends the run after that many iterations *in total* (used to test resuming).
    Returns (model, tokenizer, chat, history).
    """
    session = run_ppo(PPOSession(cfg, ws), stop_after, log_metrics)
    return session.policy, session.tokenizer, session.chat, session.history


# ----------------------------------------------------------------------------- evaluation


def eval_records(cfg: Config, ws: Workspace, split: str | None = None) -> list[QARecord]:
    """The questions an evaluation plays: split ``split`` (default ``eval.split``), its first
    ``eval.max_examples`` when that is set."""
    records = ws.split(split or cfg.eval.split)
    return records[: cfg.eval.max_examples] if cfg.eval.max_examples else records


def run_eval(cfg: Config, ws: Workspace, model, tokenizer, chat, tag: str, split: str | None = None,
             engine: RolloutEngine | None = None) -> EvalResult:
    """Evaluate greedy and sampled on a split; writes eval_{tag}.json and trajectories_{tag}.txt.
    ``engine`` replaces the default one (e.g. :func:`naive_rag_engine`'s)."""
    records = eval_records(cfg, ws, split)
    engine = engine or make_engine(cfg, ws.env, model, tokenizer, chat, ws.device)
    temp = cfg.eval.sampled_temperature or cfg.rollout.temperature
    result = evaluate(engine, records, seed=cfg.seed + 12_345, sampled_temperature=temp,
                      batch_size=cfg.eval.batch_size)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"eval_{tag}.json").write_text(json.dumps(result.metrics, indent=1, sort_keys=True))
    questions = {r.id: r.question for r in records}
    shown = []
    for mode in ("greedy", "sampled"):
        for t in result.trajectories[mode][: cfg.eval.render_examples]:
            shown.append(f"## {mode}\n" + render_trajectory(t, tokenizer, questions[t.record_id]))
    (out / f"trajectories_{tag}.txt").write_text("\n\n".join(shown) + "\n")
    return result


def naive_rag_engine(cfg: Config, ws: Workspace, model, tokenizer, chat, records: list) -> RolloutEngine:
    """A rollout engine playing naive RAG on ``records`` (:mod:`agentr1.rollout.forced`): a
    2-turn environment, the first turn forced to a search for the question (its first
    ``env.max_query_chars`` characters), the second to open with the answer tag."""
    from agentr1.env.protocol import ANSWER_START, format_tool_call
    from agentr1.rollout.forced import NaiveRAGBackend

    env = build_env(cfg.model_copy(update={"env": cfg.env.model_copy(update={"max_turns": 2})}), ws.data_dir)
    engine = make_engine(cfg, env, model, tokenizer, chat, ws.device)
    system = env.system_turn()
    first = {tuple(chat.prompt_ids(system, env.user_prompt(r))):
             chat.turn_ids(format_tool_call(r.question[: cfg.env.max_query_chars])) for r in records}
    engine.backend = NaiveRAGBackend(engine.backend, first, chat.prefix_ids(ANSWER_START))
    return engine


def stage_baselines(cfg: Config, ws: Workspace) -> dict[str, dict[str, float]]:
    """The untrained model of a pretrained run (``eval.baselines``) on the evaluation split, played
    and scored exactly as the trained agent will be: ``zero_shot`` (the instruct model as it comes,
    told the tool protocol only by the environment's instructions, also where the run's agent
    reads no system turn) and ``naive_rag`` (the same model after a forced search for the question). Writes ``eval_<baseline>.json`` and
    ``trajectories_<baseline>.txt``; returns their metrics by baseline."""
    model, tokenizer, chat = build_model(cfg, ws, [], [])
    model.eval()
    # An untrained model knows the tool protocol only from the instructions: where the run leaves
    # the system turn out (its agent learns the protocol in the warm-up), the baselines get the
    # environment's own.
    told = cfg if cfg.env.system_prompt != "" else \
        cfg.model_copy(update={"env": cfg.env.model_copy(update={"system_prompt": None})})
    out = {}
    for name in cfg.eval.baselines:
        log.info("baseline %s: evaluating the untrained %s on %s", name, cfg.model.name_or_path, cfg.eval.split)
        engine = naive_rag_engine(told, ws, model, tokenizer, chat, eval_records(cfg, ws)) if name == "naive_rag" \
            else make_engine(told, build_env(told, ws.data_dir), model, tokenizer, chat, ws.device)
        out[name] = run_eval(cfg, ws, model, tokenizer, chat, name, engine=engine).metrics
        log.info("baseline %s: greedy EM %.3f, sampled EM %.3f", name, out[name]["greedy/em"], out[name]["sampled/em"])
    return out


def _load_policy(ws: Workspace, path: Path):
    """The policy saved in ``path`` with its chat format."""
    from models.chat import ChatFormat
    from models.policy import load_actor_critic

    model, tokenizer = load_actor_critic(path, device=ws.device)
    return model, tokenizer, ChatFormat(tokenizer, ws.tools)


def finished_warmup(cfg: Config) -> Path | None:
    """``output_dir/warmup`` when a finished warm-up of this configuration is there (reuse it),
    None when there is none or only an unfinished one (train it again); a finished warm-up made
    with another configuration is an error naming the keys that differ."""
    out = Path(cfg.output_dir) / WARMUP_DIR
    stats = out / WARMUP_STATS
    if not stats.exists():
        return None
    verify_manifest(out, f"delete {out} to warm up again")
    check_same_config(json.loads(stats.read_text()).get("config"), warmup_identity(cfg), out,
                      f"use another output_dir, or delete {out} to warm up again")
    return out


def stage_warmup(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None) -> EvalResult:
    """Warm up (unless a finished warm-up of this configuration is there) and evaluate it."""
    if finished_warmup(cfg):
        log.info("reusing the warm-up checkpoint in %s", Path(cfg.output_dir) / WARMUP_DIR)
        model, tokenizer, chat = _load_policy(ws, Path(cfg.output_dir) / WARMUP_DIR)
    else:
        model, tokenizer, chat = warmup(cfg, ws, log_metrics)
    return run_eval(cfg, ws, model, tokenizer, chat, "warmup")


def stage_ppo(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None) -> list[dict]:
    """PPO from the warm-up (resuming if a checkpoint exists); writes final/, metrics.jsonl and
    learning_curve.png."""
    history = train_ppo(cfg, ws, log_metrics)[3]
    if PartialState().is_main_process:  # data parallel: the main process writes the results
        write_final_policy(cfg)
        write_history(cfg, history)
    return history


def selected_policy(cfg: Config) -> tuple[Path, dict]:
    """The policy a run's ``final/`` is made of, and what chose it: the best on dev
    (``checkpoints/best``, with ``ppo.dev_every``), else the last PPO checkpoint, else the
    warm-up (no iteration ran)."""
    out = Path(cfg.output_dir)
    best, last = out / BEST_DIR, out / LAST_DIR
    if cfg.ppo.dev_every and best.exists():
        record = json.loads((best / BEST_FILE).read_text())
        return best / ckpt.POLICY_DIR, {"by": f"dev {cfg.ppo.dev_metric}", "iteration": record["iteration"],
                                        "dev_score": record["score"]}
    if last.exists():
        return last / ckpt.POLICY_DIR, {"by": "last", "iteration": ckpt.load_state(last)["iteration"]}
    return out / WARMUP_DIR, {"by": "last", "iteration": 0}


def write_final_policy(cfg: Config) -> Path:
    """``final/``, a copy of :func:`selected_policy`'s choice, with ``selected.json`` saying which
    (iteration, and why); its one writer, whichever entry point ran the iterations."""
    source, selected = selected_policy(cfg)

    def write(d: Path) -> None:
        shutil.copytree(source, d, dirs_exist_ok=True)
        write_json(d / SELECTED_FILE, selected)

    log.info("final policy: iteration %d (%s)", selected["iteration"], selected["by"])
    return ckpt.atomic_dir(Path(cfg.output_dir) / FINAL_DIR, write)


def final_selection(final_dir: str | Path) -> dict | None:
    """What :func:`write_final_policy` recorded of the policy in ``final_dir`` (for summary.json)."""
    path = Path(final_dir) / SELECTED_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_history(cfg: Config, history: list[dict]) -> Path | None:
    """``metrics.jsonl`` (one line per PPO iteration) and, after at least one iteration, the
    learning curve beside it, whose path is returned: the one writer of both, whichever entry
    point ran the iterations."""
    from agentr1.plots import plot_learning_curve

    out = Path(cfg.output_dir)
    write_json(out / HISTORY_FILE, history)
    if not history:
        return None
    return plot_learning_curve(history, out / CURVE_FILE, title=f"masked PPO ({cfg.ppo.estimator})")


def write_summary(cfg: Config, summary: dict) -> Path:
    """``summary.json`` of a run (what ``agentr1 train`` returns, or the pipeline's, which adds
    the registration); its one writer."""
    return write_json(Path(cfg.output_dir) / SUMMARY_FILE, summary)


def stage_evaluate(cfg: Config, ws: Workspace) -> dict:
    """Evaluate final/: test metrics before (warm-up) and after PPO, for summary.json."""
    out = Path(cfg.output_dir)
    after = run_eval(cfg, ws, *_load_policy(ws, out / FINAL_DIR), "final")
    before = json.loads((out / "eval_warmup.json").read_text())
    summary = {"warmup": before, "final": after.metrics, "output_dir": str(out),
               "selected": final_selection(out / FINAL_DIR),
               "gain": {k: after.metrics[k] - before[k] for k in HEADLINE_KEYS}}
    baselines = {b: out / f"eval_{b}.json" for b in cfg.eval.baselines}
    if baselines:
        summary["baselines"] = {b: json.loads(p.read_text()) for b, p in baselines.items() if p.exists()}
    return summary


def train(cfg: Config, log_metrics: MetricsFn | None = None, stages: tuple[str, ...] = TRAIN_STAGES) -> dict:
    """The recipe, or some of its stages (``dvc.yaml`` runs them one by one); returns a
    summary with test EM before and after PPO and the seconds each stage took."""
    unknown = set(stages) - set(TRAIN_STAGES)
    if unknown:
        raise ValueError(f"unknown stage(s) {sorted(unknown)}; choose from {TRAIN_STAGES}")
    if launched_processes() > 1 and set(stages) - {"ppo"}:
        raise ConfigError(f"stages {sorted(set(stages) - {'ppo'})} run in one process; under accelerate launch "
                          "with several processes run --stage ppo only (agentr1/rl/distributed.py)")
    ws = Workspace.build(cfg)  # the data is checked before anything is written
    if {"warmup", "ppo"} & set(stages):
        ws.split("train")
    if "warmup" in stages:
        check_demonstrable(cfg, ws)
    ws.split(cfg.eval.split)
    if "ppo" in stages:
        check_dev_split(cfg, ws)
    claim_run_dir(cfg.output_dir)
    seconds: dict[str, float] = {}
    summary: dict = {}
    for stage in TRAIN_STAGES:
        if stage not in stages or (stage == "baselines" and not cfg.eval.baselines):
            continue
        t0 = time.time()
        if stage == "baselines":
            summary["baselines"] = stage_baselines(cfg, ws)
        elif stage == "warmup":
            summary["warmup"] = stage_warmup(cfg, ws, log_metrics).metrics
        elif stage == "ppo":
            summary["iterations"] = len(stage_ppo(cfg, ws, log_metrics))
        else:
            summary.update(stage_evaluate(cfg, ws))
        seconds[stage] = time.time() - t0
    summary["seconds"] = {**seconds, "total": sum(seconds.values())}
    if "evaluate" in stages:
        write_summary(cfg, summary)
    return summary
