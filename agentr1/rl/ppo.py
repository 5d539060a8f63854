"""One masked-PPO iteration's math, on a :class:`~agentr1.rollout.batch.RolloutBatch`.

Reads top to bottom: score the batch with the current, reference and value networks ->
rewards -> advantages -> epochs of clipped minibatch updates. Shapes follow
:mod:`agentr1.rollout.batch`: (B, L) token ids, (B, T = L - 1) per-token tensors.

Switches (the paper's ablations), all plain arguments:
- ``loss_mask``: average policy/value loss, KL and entropy over action tokens only; off, over
  every response token (environment tokens included).
- ``advantage_mask``: GAE over action tokens only, bridging environment spans; off, plain GAE
  over every response token.
- process rewards are already on the batch (zero when the environment had them disabled).

Data parallel: with an ``accelerator`` of several processes, every process holds the whole
(gathered) batch; scoring and each minibatch's update are split across processes and the
results equal one process's (see :mod:`agentr1.rl.distributed`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentr1.config import CRITIC_ESTIMATORS, Estimator
from agentr1.rl.core import (
    anchor_states,
    compute_gae,
    compute_step_gae,
    explained_variance,
    gigpo_advantages,
    grpo_advantages,
    kl_penalty,
    loss_mean,
    masked_mean,
    masked_whiten,
    policy_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    token_stats_for,
    value_loss,
)
from agentr1.rl.distributed import gather_rows, row_shards, sum_gradients
from agentr1.rl.guard import StepGuard
from agentr1.rollout.batch import RolloutBatch, length_bucketed_batches


@dataclass(frozen=True)
class PPOHyper:
    """The knobs of one PPO update, without defaults: they come from the validated config only
    (``agentr1.recipe.ppo.ppo_hyper``), so the default run has one source (``agentr1/config.py``)."""

    estimator: Estimator
    loss_mask: bool
    advantage_mask: bool
    loss_weighting: str
    gigpo_step_weight: float
    gigpo_norm_by_std: bool
    epochs: int
    minibatch_size: int
    minibatch_window: int | None
    grad_accum: int
    score_rows: int | None
    clip_eps: float
    clip_eps_high: float | None
    dual_clip_c: float | None
    vf_coef: float
    vf_clip: float
    kl_coef: float
    kl_kind: str
    kl_in_reward: bool
    kl_clamp: float
    entropy_coef: float
    gamma: float
    lam: float
    whiten_advantages: bool
    max_grad_norm: float
    temperature: float


@dataclass
class Scored:
    """What the frozen forward passes give for a batch, all (B, T)."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    token_rewards: torch.Tensor
    trunk: torch.Tensor | None = None
    """(B, L, H) output of the policy's frozen layers (``ActorCritic.frozen_layers``), computed
    once and reused by the reference pass and every epoch; None when nothing is frozen."""


def forward_tokens(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   positions: torch.Tensor | None = None, trunk: torch.Tensor | None = None):
    """Log-probs (B, T) of tokens 1..L-1, values (B, T), and optionally entropy (B, T).

    With ``positions`` (B, T), log-probs and entropy are computed only there (0 elsewhere):
    the LM head runs on those hidden states alone. ``trunk`` (B, L, H): the frozen layers'
    output for these rows (see :class:`Scored`), so only the layers above run.
    """
    extra = {} if trunk is None else {"trunk": trunk}
    stats = token_stats_for(model)
    if positions is None:
        logits, values = model(input_ids=input_ids, attention_mask=attention_mask, **extra)
        logp, ent = stats(logits[:, :-1], input_ids[:, 1:], temperature, with_entropy)
        return logp, values[:, :-1].float(), ent
    where = positions.bool()
    at = torch.zeros_like(input_ids, dtype=torch.bool)
    at[:, :-1] = where  # the logits at position j - 1 predict token j
    packed, values = model(input_ids=input_ids, attention_mask=attention_mask, logits_at=at, **extra)
    packed_logp, packed_ent = stats(packed[None], input_ids[:, 1:][where][None], temperature, with_entropy)  # (1, N)
    logp = torch.zeros(where.shape, dtype=torch.float32, device=input_ids.device)
    logp[where] = packed_logp[0]
    ent = None
    if with_entropy:
        ent = torch.zeros_like(logp)
        ent[where] = packed_ent[0]
    return logp, values[:, :-1].float(), ent


def _network(model, accelerator):
    """The module to run forward passes on: never the DDP wrapper, whose forward would start its
    own gradient reduction and buffer broadcasts (gradients are summed by ``sum_gradients``)."""
    return model if accelerator is None else accelerator.unwrap_model(model)


def _parallel(accelerator) -> bool:
    return accelerator is not None and accelerator.num_processes > 1


def advantage_positions(batch: RolloutBatch, hp: PPOHyper) -> torch.Tensor:
    """Where advantages and returns are computed (B, T): the action tokens under the advantage
    mask, else every response token (tool responses included, as plain GAE would)."""
    return batch.action_mask if hp.advantage_mask else batch.response_mask


@torch.no_grad()
def score_batch(model, ref_model, batch: RolloutBatch, hp: PPOHyper,
                accelerator=None) -> tuple[Scored, dict[str, float]]:
    """Old log-probs, reference log-probs, values, rewards and advantages for the batch.

    With an ``accelerator`` of several processes each scores its :func:`row_shards` share of the
    rows and the results are gathered: the estimators (whitening, group statistics) then see the
    global batch, the same on every process.
    """
    loss_mask = batch.action_mask if hp.loss_mask else batch.response_mask
    rows = row_shards(len(batch), accelerator.num_processes)[accelerator.process_index] \
        if _parallel(accelerator) else slice(None)
    ids, attn, at = batch.input_ids[rows], batch.attention_mask[rows], loss_mask[rows]
    net = _network(model, accelerator)
    # The frozen layers' output, once for the policy, the reference (which shares those layers:
    # agentr1.recipe.ppo.share_frozen_layers) and every epoch. Data parallel shards rows: not there.
    with_trunk = not _parallel(accelerator) and getattr(net, "frozen_layers", 0)
    # Chunks of ppo.score_rows rows of similar lengths (longest first), each cut to its own longest
    # row: the pads of a batch of mixed lengths are not run (on SmolLM2's demonstrations a quarter
    # of a 32-row batch's positions), and one chunk's logits, not the batch's, are in memory at once.
    # Positions past a row's end stay 0 (they are masked everywhere).
    lengths = attn.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    old_logp, old_values, ref_logp = (torch.zeros(at.shape, device=ids.device) for _ in range(3))
    trunk = None
    step = hp.score_rows or hp.minibatch_size
    for s in range(0, len(ids), step):
        c = order[s:s + step]
        n = int(lengths[c].max())
        c_ids, c_attn, c_at = ids[c, :n], attn[c, :n], at[c, :n - 1]
        t = net.trunk_states(c_ids, c_attn) if with_trunk else None
        old_logp[c, :n - 1], old_values[c, :n - 1] = forward_tokens(net, c_ids, c_attn, hp.temperature,
                                                                    positions=c_at, trunk=t)[:2]
        ref_logp[c, :n - 1] = forward_tokens(ref_model, c_ids, c_attn, hp.temperature, positions=c_at, trunk=t)[0]
        if t is not None:
            if trunk is None:
                trunk = t.new_zeros((*ids.shape, t.shape[-1]))
            trunk[c, :n] = t
    if _parallel(accelerator):
        old_logp, old_values, ref_logp = (gather_rows(accelerator, x, len(batch))
                                          for x in (old_logp, old_values, ref_logp))
    adv_mask = advantage_positions(batch, hp)
    token_rewards = batch.process_rewards + batch.outcome_rewards
    kl = kl_penalty(old_logp, ref_logp, hp.kl_kind, hp.kl_clamp)
    if hp.kl_in_reward:
        token_rewards = token_rewards - hp.kl_coef * kl * loss_mask
    returns = None
    if hp.estimator == "gae":
        adv, returns = compute_gae(token_rewards, old_values, adv_mask, hp.gamma, hp.lam)
        if hp.whiten_advantages:  # over the tokens that learn from them (verl: the response mask)
            adv = masked_whiten(adv, adv_mask * loss_mask)
    elif hp.estimator == "step_gae":
        adv, returns = compute_step_gae(token_rewards, old_values, adv_mask, hp.gamma, hp.lam, hp.whiten_advantages)
    elif hp.estimator == "grpo":
        adv = grpo_advantages(batch.scores, batch.group_ids, adv_mask)
    elif hp.estimator == "gigpo":
        adv = gigpo_advantages(token_rewards, adv_mask, batch.scores, batch.group_ids,
                               anchor_states(batch.input_ids, adv_mask), hp.gamma, hp.gigpo_step_weight,
                               hp.gigpo_norm_by_std)
    elif hp.estimator == "rloo":
        adv = rloo_advantages(batch.scores, batch.group_ids, adv_mask)
    elif hp.estimator == "reinforce_pp":
        adv = reinforce_pp_advantages(token_rewards, adv_mask, hp.gamma, whiten_mask=adv_mask * loss_mask)
    else:
        raise ValueError(f"unknown estimator {hp.estimator!r}")
    if returns is None:  # critic-free estimators: the value head is not trained
        returns = torch.zeros_like(adv)
    metrics = {
        "actor/ref_kl": float(masked_mean(kl, batch.action_mask)),
        "actor/rollout_logp_gap": float(masked_mean((old_logp - batch.rollout_logprobs).abs(), batch.action_mask)),
        "critic/values_mean": float(masked_mean(old_values, loss_mask)),
        "critic/returns_mean": float(masked_mean(returns, adv_mask)),
        "critic/advantages_abs": float(masked_mean(adv.abs(), adv_mask)),
    }
    if hp.estimator in CRITIC_ESTIMATORS:
        metrics["critic/explained_variance"] = float(explained_variance(old_values, returns, adv_mask))
    return Scored(old_logp, ref_logp, old_values, adv, returns, token_rewards, trunk), metrics


STEP_METRICS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy",
                "critic/vf_loss", "critic/vf_clipfrac")
"""What each minibatch step reports (means over the minibatch, weighted as ``ppo.loss_weighting``
says), in this order."""


def minibatch_loss(net, batch: RolloutBatch, scored: Scored, hp: PPOHyper, rows: list[int], L: int,
                   loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, list[float]]:
    """The PPO loss of ``rows`` cut to length ``L`` in its two parts, each a mean over its own
    positions (by token or by trajectory): the actor's (policy, entropy, KL) over ``loss_mask``,
    the critic's (``vf_coef`` x value loss; None for critic-free estimators) over the advantage
    positions; and its :data:`STEP_METRICS` (the actor's five, then the critic's two)."""
    idx = torch.tensor(rows)
    mask = loss_mask[idx, : L - 1]
    cut = lambda x: x[idx, : L - 1]  # noqa: E731 - per-token tensors of these rows
    trunk = None if scored.trunk is None else scored.trunk[idx, :L]
    logp, values, ent = forward_tokens(net, batch.input_ids[idx, :L], batch.attention_mask[idx, :L],
                                       hp.temperature, with_entropy=True, positions=mask, trunk=trunk)
    per_trajectory = hp.loss_weighting == "trajectory"
    pg, pg_m = policy_loss(logp, cut(scored.old_logp), cut(scored.advantages), mask,
                           hp.clip_eps, hp.clip_eps_high, hp.dual_clip_c, per_trajectory)
    kl = loss_mean(kl_penalty(logp, cut(scored.ref_logp), hp.kl_kind, hp.kl_clamp), mask, per_trajectory)
    entropy = loss_mean(ent, mask, per_trajectory)
    loss = pg - hp.entropy_coef * entropy
    if not hp.kl_in_reward:
        loss = loss + hp.kl_coef * kl
    vf_m: dict[str, float] = {}
    critic = None
    if hp.estimator in CRITIC_ESTIMATORS:  # critic-free estimators leave the value head alone
        # The critic learns wherever the estimator reads it, which is where the returns are: the
        # advantage positions (with the advantage mask off, GAE reads values at tool tokens too).
        vf, vf_m = value_loss(values, cut(scored.old_values), cut(scored.returns), cut(advantage_positions(batch, hp)),
                              hp.vf_clip, per_trajectory)
        critic = hp.vf_coef * vf
    return loss, critic, [pg_m["pg_loss"], pg_m["pg_clipfrac"], pg_m["ppo_kl"], float(kl.detach()),
                          float(entropy.detach()), vf_m.get("vf_loss", 0.0), vf_m.get("vf_clipfrac", 0.0)]


def micro_batches(rows: list[int], k: int) -> list[list[int]]:
    """``rows`` in at most ``k`` contiguous, nearly equal, non-empty parts (``ppo.grad_accum``)."""
    return [rows[s] for s in row_shards(len(rows), min(k, len(rows)))] if rows else []


def _loss_weight(loss_mask: torch.Tensor, rows: list[int], L: int, hp: PPOHyper) -> float:
    """What the loss of ``rows`` averages over: its loss-masked tokens, or (``loss_weighting:
    trajectory``) its rows that have one."""
    counted = loss_mask[torch.tensor(rows), : L - 1]
    if hp.loss_weighting == "trajectory":
        return float(counted.bool().any(dim=-1).sum())
    return float(counted.sum())


def ppo_update(model, optimizer, accelerator, batch: RolloutBatch, scored: Scored, hp: PPOHyper,
               generator: torch.Generator, guard: StepGuard,
               after_step: Callable[[], object] | None = None) -> dict[str, float]:
    """Epochs of shuffled minibatch updates; returns metrics averaged over the minibatches that
    stepped. A minibatch whose loss or gradient norm is not finite does not step (``guard``
    counts it in ``actor/skipped_steps`` and stops the run after too many in a row).
    ``after_step()`` runs after each minibatch (the recipe's thread governor).

    With several processes (each holding the whole batch, the same ``generator`` state) the
    minibatches are the same; each process takes rows ``mb[rank::world]`` and weighs each part of
    its loss by its share of the minibatch's positions of that part (:func:`_loss_weight`: the
    actor's over the loss mask, the critic's over the advantage positions, which differ when one
    mask is off), so the summed gradients, the loss and the metrics are the means over the whole
    minibatch, as on one process; ``ppo.grad_accum``'s micro-batches likewise.
    """
    net = _network(model, accelerator)
    parallel = _parallel(accelerator)
    params = [q for q in net.parameters() if q.requires_grad]
    loss_mask_full = batch.action_mask if hp.loss_mask else batch.response_mask
    critic_mask = advantage_positions(batch, hp) if hp.estimator in CRITIC_ESTIMATORS else None
    totals: dict[str, float] = {}
    n_updates = 0
    lengths = batch.attention_mask.sum(dim=1).tolist()
    for _ in range(hp.epochs):
        # Minibatches of similar lengths, each cut to its own longest sequence: padding to the
        # batch's longest episode wasted about a third of the update's compute.
        window = hp.minibatch_window or len(lengths)
        for mb in length_bucketed_batches(lengths, hp.minibatch_size, generator, bucket=window):
            L = max(lengths[i] for i in mb)
            n_tokens = _loss_weight(loss_mask_full, mb, L, hp)
            n_critic = _loss_weight(critic_mask, mb, L, hp) if critic_mask is not None else 0.0
            if n_tokens == 0 and n_critic == 0:  # nothing to learn from: a step would only decay weights
                continue
            mine = mb[accelerator.process_index::accelerator.num_processes] if parallel else mb
            step_v = [0.0] * (1 + len(STEP_METRICS))
            with accelerator.autocast():
                # ppo.grad_accum micro-batches of this process's rows, each forwarded and
                # backpropagated on its own (memory), weighted by its share of the minibatch's
                # tokens: the summed gradient is the minibatch's, and the optimizer steps once.
                for rows in micro_batches(mine, hp.grad_accum):
                    L_rows = max(lengths[i] for i in rows)
                    # each part weighs by its share of the minibatch's positions of that part
                    # (exactly 1.0 on one process, one micro-batch); a part with none here adds nothing
                    w_actor = _loss_weight(loss_mask_full, rows, L_rows, hp) / n_tokens if n_tokens else 0.0
                    w_critic = _loss_weight(critic_mask, rows, L_rows, hp) / n_critic if n_critic else 0.0
                    if not (w_actor or w_critic):
                        continue
                    actor, critic, values = minibatch_loss(net, batch, scored, hp, rows, L_rows, loss_mask_full)
                    parts = [x * w for x, w in ((actor, w_actor), (critic, w_critic)) if w and x is not None]
                    share = parts[0] if len(parts) == 1 else parts[0] + parts[1]
                    weights = [w_critic if k.startswith("critic/") else w_actor for k in STEP_METRICS]
                    step_v = [a + b for a, b in zip(step_v, [float(share.detach())]
                                                    + [v * w for v, w in zip(values, weights)])]
                    if math.isfinite(step_v[0]):  # a non-finite one skips the step below anyway
                        accelerator.backward(share)
            if parallel:  # one all-reduce: the minibatch's loss and metrics over every process
                step_v = accelerator.reduce(torch.tensor(step_v, dtype=torch.float64,
                                                         device=batch.input_ids.device), "sum").tolist()
            loss_v = step_v[0]
            grad_norm = None
            if math.isfinite(loss_v):  # the same decision on every process: loss_v is global
                if parallel:
                    sum_gradients(accelerator, params)
                grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), hp.max_grad_norm))
            stepped = guard.ok(loss_v, grad_norm)
            if stepped:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if after_step is not None:
                after_step()
            if not stepped:
                continue
            step_m = dict(zip(STEP_METRICS, step_v[1:]))
            if grad_norm is not None:
                step_m["actor/grad_norm"] = grad_norm
            for k, v in step_m.items():
                totals[k] = totals.get(k, 0.0) + v
            n_updates += 1
    out = {k: v / max(n_updates, 1) for k, v in totals.items()}
    out["actor/n_updates"] = float(n_updates)
    out["actor/skipped_steps"] = float(guard.take_skipped())
    return out
