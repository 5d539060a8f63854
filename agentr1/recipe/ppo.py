"""Masked PPO from the warm-up: :class:`PPOSession` holds a run between iterations (opened from
the warm-up or the last checkpoint, saved back), and :func:`run_ppo` is the one loop of
iterations every entry point drives."""
from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
from accelerate.utils import gather_object

from agentr1 import checkpoint as ckpt
from agentr1.config import Config, ConfigError
from agentr1.data.records import DataError, QARecord
from agentr1.device import ThreadGovernor
from agentr1.episode import Trajectory
from agentr1.errors import UserError
from agentr1.evaluate import evaluate
from agentr1.fsutil import recover_dir, verify_manifest, write_json
from agentr1.recipe.workspace import MetricsFn, Workspace, make_engine
from agentr1.rl.control import DEV_SCORE, adapt_kl_coef, dev_score, lr_warmup_factor, stop_reason
from agentr1.rl.distributed import make_accelerator
from agentr1.rl.guard import StepGuard, TrainingDiverged, assert_finite_outputs
from agentr1.rl.ppo import PPOHyper, ppo_update, score_batch
from agentr1.rollout.batch import collate
from agentr1.rollout.checks import RolloutBatchError, check_batch, reward_bound
from agentr1.rollout.engine import PROGRESS_EVERY_S
from agentr1.rundir import BEST_DIR, BEST_FILE, LAST_DIR, WARMUP_DIR, check_same_config, ppo_identity

log = logging.getLogger("agentr1.train")


def ppo_hyper(cfg: Config) -> PPOHyper:
    p = cfg.ppo
    return PPOHyper(estimator=p.estimator, loss_mask=p.loss_mask, advantage_mask=p.advantage_mask,
                    loss_weighting=p.loss_weighting, gigpo_step_weight=p.gigpo_step_weight,
                    gigpo_norm_by_std=p.gigpo_norm == "std",
                    epochs=p.epochs, minibatch_size=p.minibatch_size, minibatch_window=p.minibatch_window,
                    grad_accum=p.grad_accum, score_rows=p.score_rows, clip_eps=p.clip_eps, clip_eps_high=p.clip_eps_high,
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


def rollout_metrics(trajs: list[Trajectory], extra: tuple[str, ...] = ()) -> dict[str, float]:
    n = len(trajs)
    keys = ("em", "f1", "contains", "format_ok", "n_calls", "n_bad_calls", "support_recall", "turns", *extra)
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
        from models.policy import load_actor_critic, ready_to_train, train_top_layers, without_dropout

        self.cfg, self.ws = cfg, ws
        p = cfg.ppo
        if p.kl_kind == "k1" and not p.kl_in_reward and p.kl_coef > 0:
            log.warning("ppo.kl_kind=k1 in the loss: its expected gradient is 0, so the KL term regularises "
                        "nothing; use k2 (the gradient of KL(pi || pi_ref)) or k3, or ppo.kl_in_reward=true")
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
        if without_dropout(model):
            log.info("PPO: dropout set to 0 in the policy (old and new log-probs must come from the same function)")
        self.ref_model, _ = load_actor_critic(out / WARMUP_DIR, device=ws.device)
        self.ref_model.eval().requires_grad_(False)
        share_frozen_layers(model, self.ref_model, out / WARMUP_DIR)
        self.chat = ChatFormat(self.tokenizer, ws.tools)
        p = cfg.ppo
        self.hp = ppo_hyper(cfg)
        self.guard = StepGuard(cfg.max_nonfinite_steps)
        self.governor = ThreadGovernor()  # fewer threads while other programs keep the cores busy
        bound = reward_bound(cfg.reward.model_dump(), cfg.env.max_turns)
        self.reward_bounds = (-bound, bound)
        self.acc = make_accelerator(ws.device, p.mixed_precision)
        ready_to_train(model, ws.device, self.acc.mixed_precision, cfg.model.compile)
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
            self.guard.in_row = saved.get("skipped_in_row", 0)  # non-finite steps in a row go on counting
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
        self.governor.step()
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
        self.governor.step()
        batch = collate(trajs, self.chat.pad_token_id).to(self.ws.device)
        t1 = time.time()
        hp = replace(self.hp, kl_coef=self.kl_coef)
        with self.acc.autocast():
            scored, score_m = score_batch(self.model, self.ref_model, batch, hp, self.acc)
        t_score = time.time() - t1
        t_roll = getattr(self, "_t_rollout", 0.0)
        if t_roll + t_score >= PROGRESS_EVERY_S and self.acc.is_main_process:  # a slow model: a line before the update
            log.info("iter %3d/%d  rollouts %.0fs, scoring %.0fs; updating (%d epochs)", it + 1, p.iterations,
                     t_roll, t_score, p.epochs)
        if not (math.isfinite(score_m["actor/ref_kl"]) and math.isfinite(score_m["critic/advantages_abs"])):
            raise TrainingDiverged(f"{where}: the batch scores to non-finite log-probs or advantages "
                                   f"(KL to the reference {score_m['actor/ref_kl']}, "
                                   f"|advantage| {score_m['critic/advantages_abs']})")
        self.model.train()
        self.guard.where = where
        lr = self.scheduler.get_last_lr()[0]
        upd_m = ppo_update(self.model, self.optimizer, self.acc, batch, scored, hp,
                           torch.Generator().manual_seed(self.cfg.seed * 31 + it), self.guard, self.governor.step)
        self.scheduler.step()
        self.model.eval()
        with self.acc.autocast():
            assert_finite_outputs(self.policy, batch.input_ids, batch.attention_mask, where, scored.trunk)
        t_upd = time.time() - t1 - t_score
        # An iteration's time in three parts: sampling, scoring (old/reference log-probs, values,
        # advantages), and the epochs of minibatch updates.
        metrics = {**rollout_metrics(trajs, self.ws.env.extra_metrics), **score_m, **upd_m,
                   "actor/kl_coef": self.kl_coef, "actor/lr": lr,
                   "perf/rollout_s": t_roll, "perf/score_s": t_score, "perf/update_s": t_upd,
                   "perf/iter_s": t_roll + t_score + t_upd, "perf/threads": float(self.governor.threads),
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
                                  "dev_start": self.dev_start, "skipped_in_row": self.guard.in_row},
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
