"""Masked PPO math for multi-turn tool-using agents (Agent-R1): pure tensor functions.

Notation
--------
B       batch size (number of trajectories in the batch or minibatch)
T       response length: the tokens after the prompt, i.e. every assistant turn and every
        environment (tool response) span between turns, right-padded
V       vocabulary size
mask    (B, T) float or bool, 1 (nonzero) = the position is counted, 0 = ignored. Masks are
        binary; combine them by multiplying. ``action_mask`` is 1 on tokens the policy
        sampled, 0 on environment tokens and padding.

Rules every function keeps
--------------------------
* Values in masked-out slots never reach a result: they are removed with ``torch.where``
  (never by multiplying with the mask, since ``0 * inf`` and ``0 * nan`` are ``nan``), so a
  caller may leave padding, ``nan`` or ``inf`` there. Gradients into masked-out slots are 0.
* Per-token outputs are 0 outside the mask.
* Means over an empty mask are 0 (with zero gradient), never ``nan``.
* Estimators run under ``torch.no_grad``: advantages and returns are targets, not graph nodes.
* Metrics come back as ``dict[str, float]``.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from agentr1.config import KLKind

EPS = 1e-8
"""Added to denominators (standard deviations, counts) so that nothing divides by zero."""

KL_LOG_RATIO_LIMIT = 20.0
"""k3 exponentiates the log ratio; beyond +-20 exp() overflows float16 and the estimate is
meaningless anyway, so the log ratio is clamped first (as verl does)."""

PPO_LOG_RATIO_LIMIT = 20.0
"""log(pi/pi_old) is clamped before exp() so a stale or broken token cannot make the ratio inf."""


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _check_shapes(where: str, **tensors: torch.Tensor) -> None:
    """Raise a ValueError naming the function and the tensors whose shapes differ."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"{where}: shapes must match, got {listed}")


def _keep(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask is on, exact 0 elsewhere (whatever x held there, nan and inf included)."""
    return torch.where(_as_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


# --------------------------------------------------------------------------- masked statistics


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x over masked-in positions; over all dims (scalar) or along ``dim``."""
    kept = _keep(x, mask)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over masked-in positions; 0 (zero gradient) where nothing is masked in.

    With ``dim=None`` this is the token mean over the whole batch (a scalar); with ``dim``
    set, one mean per slice (e.g. ``dim=-1`` gives (B,) per-sequence means).
    """
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp_min(EPS)


def loss_mean(x: torch.Tensor, mask: torch.Tensor, per_trajectory: bool = False) -> torch.Tensor:
    """How a loss is averaged over its masked-in tokens: the token mean over the whole batch
    (a long trajectory weighs more), or with ``per_trajectory`` the mean over rows of each row's
    token mean, so that every trajectory weighs the same whatever its length (Agent-R1 v0.1;
    verl's ``seq-mean-token-mean``). Rows with nothing masked in do not count; all masked: 0."""
    if not per_trajectory:
        return masked_mean(x, mask)
    return masked_mean(masked_mean(x, mask, dim=-1), _as_bool(mask).any(dim=-1))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over all masked-in positions (scalar). 0 when fewer than two are counted."""
    mean = masked_mean(x, mask)
    count = _as_bool(mask).sum()
    sq_sum = masked_sum((x - mean) ** 2, mask)
    denom = count - 1 if unbiased else count
    if denom <= 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return sq_sum / denom


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / std over masked-in positions (unbiased var), 0 outside the mask.

    ``shift_mean=False`` adds the mean back: only the scale is normalised.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + EPS)
    if not shift_mean:
        whitened = whitened + mean
    return _keep(whitened, mask)


# --------------------------------------------------------------------------- logits


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels) under softmax(logits): (B, T, V), (B, T) long -> (B, T) float32.

    ``labels`` must be valid ids everywhere (use any id, e.g. pad, in masked-out slots).
    Computed as ``logit[label] - logsumexp(logits)`` in float32, which avoids building the
    full (B, T, V) log-softmax and stays exact for bf16/fp16 logits.
    """
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits): (B, T, V) -> (B, T) float32.

    ``H = logsumexp(z) - sum_v p_v z_v`` is stable for large logits. Logits must be finite
    (a -inf logit would give 0 * -inf).
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def token_stats(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``labels`` and (else None) the entropy under softmax(logits / temperature):
    (..., V), (...) long -> (...) float32 each. What every loss reads from the LM head."""
    z = logits.float() if temperature == 1.0 else logits.float() / temperature
    return logprobs_from_logits(z, labels), (entropy_from_logits(z) if with_entropy else None)


def token_stats_for(model) -> Callable:
    """:func:`token_stats`, or where ``model``'s layers are compiled (``model.compile``, marked by
    :func:`models.policy.compile_layers`) its ``torch.compile`` twin, built once, dynamic shapes:
    one fused pass over the (N, V) logits, forward and backward. SmolLM2 (49,152 words), ~400
    action tokens: 0.17-0.22 s against 0.55 s for LM head, log-probs, entropy and backward."""
    return _compiled_token_stats() if getattr(model, "compiled", False) else token_stats


_compiled_token_stats = functools.cache(lambda: torch.compile(token_stats, dynamic=True))


# --------------------------------------------------------------------------- reward placement


def last_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,) long: index of the last masked-in position of each row, -1 if none."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(_as_bool(mask), positions, -1).max(dim=-1).values


def place_outcome(outcome: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Put each row's outcome reward on its last action token: (B,), (B, T) -> (B, T).

    This holds for truncated episodes too (cut at max turns, response ending in environment
    tokens): the reward lands on the last token the policy produced. Rows with no action
    token get nothing.
    """
    if outcome.shape != action_mask.shape[:1]:
        raise ValueError(
            f"place_outcome: outcome must have shape (B,)={tuple(action_mask.shape[:1])}, "
            f"got {tuple(outcome.shape)}"
        )
    out = torch.zeros(action_mask.shape, dtype=torch.float32, device=action_mask.device)
    last = last_index(action_mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = outcome.to(out.dtype)[rows]
    return out


def place_at(
    values: list[list[float]],
    positions: list[list[int]],
    shape: tuple[int, int],
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Scatter-add per-turn rewards into a (B, T) float32 tensor (zeros elsewhere).

    ``values[b][k]`` is added at ``(b, positions[b][k])``; repeated positions accumulate.
    Typical use: process rewards, one per turn, at the last action token of that turn.
    """
    n_rows, n_cols = shape
    if len(values) != n_rows or len(positions) != n_rows:
        raise ValueError(
            f"place_at: need {n_rows} rows, got values={len(values)} positions={len(positions)}"
        )
    rows: list[int] = []
    cols: list[int] = []
    flat: list[float] = []
    for b, (vals, pos) in enumerate(zip(values, positions)):
        if len(vals) != len(pos):
            raise ValueError(f"place_at: row {b}: {len(vals)} values but {len(pos)} positions")
        for p in pos:
            if not 0 <= p < n_cols:
                raise ValueError(f"place_at: row {b}: position {p} outside [0, {n_cols})")
        rows.extend([b] * len(pos))
        cols.extend(pos)
        flat.extend(vals)
    out = torch.zeros(shape, dtype=torch.float32, device=device)
    index = (
        torch.tensor(rows, dtype=torch.long, device=out.device),
        torch.tensor(cols, dtype=torch.long, device=out.device),
    )
    return out.index_put_(index, torch.tensor(flat, dtype=out.dtype, device=out.device), accumulate=True)


# --------------------------------------------------------------------------- advantage estimators


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the masked-in positions of each row: (B, T) x3 -> (advantages, returns), (B, T).

    Masked-out positions are skipped as if absent: a masked-in position t bootstraps from the
    value at the NEXT masked-in position of its row (bridging environment spans), and the last
    masked-in position bootstraps from 0. Discounting counts masked-in steps, not tokens.

    * ``mask = action_mask`` is Agent-R1's advantage mask: the last action token of turn k
      uses V(first action token of turn k+1), never a tool-response token.
    * ``mask = all response tokens`` is plain GAE.

    Rewards on masked-out positions are IGNORED: the caller must put rewards on masked-in
    tokens (``place_outcome`` / ``place_at`` with action-token positions do this).
    ``returns = advantages + values``; both are 0 outside the mask.
    """
    _check_shapes("compute_gae", token_rewards=token_rewards, values=values, mask=mask)
    on = _as_bool(mask)
    rewards = _keep(token_rewards.float(), on)
    vals = _keep(values.float(), on)
    n_rows, n_cols = rewards.shape
    next_value = rewards.new_zeros(n_rows)
    next_adv = rewards.new_zeros(n_rows)
    columns = []
    for t in reversed(range(n_cols)):
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        adv_t = delta + gamma * lam * next_adv
        # Off-mask positions leave the carried state untouched: that is the bridging.
        next_value = torch.where(on[:, t], vals[:, t], next_value)
        next_adv = torch.where(on[:, t], adv_t, next_adv)
        columns.append(_keep(adv_t, on[:, t]))
    advantages = torch.stack(columns[::-1], dim=1)
    return advantages, _keep(advantages + vals, on)


def turn_ids(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T) long: which turn of its row each masked-in position belongs to (0, 1, ...;
    a turn is a maximal run of masked-in positions), -1 outside the mask."""
    on = _as_bool(mask)
    return torch.where(on, _turn_starts(on).long().cumsum(dim=-1) - 1, -1)


def _turn_starts(on: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B, T) bool: the first position of each run of ``on``."""
    before = torch.zeros_like(on)
    before[:, 1:] = on[:, :-1]
    return on & ~before


class Turns:
    """The turns of the rows of a (B, T) mask, and per-turn (B, K) tables of token tensors;
    K is the most turns of any row, and ``present`` (B, K) marks the turns a row has."""

    def __init__(self, mask: torch.Tensor):
        turn = turn_ids(mask)
        self.on = turn >= 0
        self.n = int(turn.max()) + 1 if bool(self.on.any()) else 0
        self.slot = turn.clamp_min(0)  # off-mask positions add 0 to turn 0 and are masked out
        self.starts = _turn_starts(self.on)
        self.present = self.sum(self.on.float()) > 0

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, K) float32: the sum of x over each turn's positions."""
        table = torch.zeros(self.on.shape[0], self.n, dtype=torch.float32, device=self.on.device)
        return table.scatter_add_(1, self.slot, _keep(x.float(), self.on)) if self.n else table

    def first(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, K) float32: x at each turn's first position."""
        return self.sum(_keep(x.float(), self.starts))

    def spread(self, table: torch.Tensor) -> torch.Tensor:
        """(B, K) -> (B, T) float32: each masked-in position gets its turn's entry, 0 elsewhere."""
        if not self.n:
            return torch.zeros(self.on.shape, dtype=torch.float32, device=self.on.device)
        return _keep(table.float().gather(1, self.slot), self.on)


@torch.no_grad()
def compute_step_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-level GAE (Agent-R1 v0.1): each turn is one step -> (advantages, returns), (B, T).

    A turn is a maximal run of masked-in positions (with the action mask, one model turn). Its
    reward is the sum of its tokens' rewards, its value the value at its first token (the state
    before the turn is written); GAE runs over the turns of each row, the last bootstrapping
    from 0, and every token of turn k gets A_k and the return A_k + V_k. Discounting counts
    turns, not tokens. ``whiten`` whitens over the batch's turns, each counted once however long
    (as Agent-R1 does; token-level whitening would weight long turns more). With a mask that
    covers the whole response (no advantage mask) the response is one step.
    Rewards on masked-out positions are ignored, as in :func:`compute_gae`."""
    _check_shapes("compute_step_gae", token_rewards=token_rewards, values=values, mask=mask)
    turns = Turns(mask)
    rewards, vals, present = turns.sum(token_rewards), turns.first(values), turns.present
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    columns = []
    for k in reversed(range(turns.n)):  # a row's missing turns come after its last: they stay 0
        adv_k = _keep(rewards[:, k] + gamma * next_value - vals[:, k] + gamma * lam * next_adv, present[:, k])
        next_value, next_adv = vals[:, k], adv_k
        columns.append(adv_k)
    step_adv = torch.stack(columns[::-1], dim=1) if columns else rewards
    step_ret = _keep(step_adv + vals, present)
    if whiten:
        step_adv = masked_whiten(step_adv, present)
    return turns.spread(step_adv), turns.spread(step_ret)


def anchor_states(input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L) token ids, (B, T = L - 1) mask -> (B, K) long: an id for the state each turn starts
    from, equal for two turns exactly when the tokens before them are (the prompt, earlier turns
    and tool answers), -1 where a row has no turn k. Rows must start at index 0 (right padding)."""
    turns = Turns(mask)
    states = torch.full((input_ids.shape[0], turns.n), -1, dtype=torch.long)
    seen: dict[bytes, int] = {}
    for b, t in torch.nonzero(turns.starts).tolist():  # mask position t predicts token t + 1
        key = input_ids[b, : t + 1].cpu().numpy().tobytes()
        states[b, int(turns.slot[b, t])] = seen.setdefault(key, len(seen))
    return states.to(input_ids.device)


@torch.no_grad()
def gigpo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    states: torch.Tensor,
    gamma: float,
    step_weight: float = 1.0,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """GiGPO (Feng et al. 2025), critic-free with turn-level credit -> (B, T).

    Each turn's advantage is the episode's GRPO advantage (its ``scores`` against its group's)
    plus ``step_weight`` times a step advantage: the turn's discounted return from that turn
    (turn rewards are the sums of their tokens' rewards, discounted per turn) against the other
    turns of its episode group (``group_ids``) that start from the same state (``states`` (B, K),
    from :func:`anchor_states`): the paper's "group in group", so two episodes of different
    groups that share a state (the same first prompt asked twice) never compare. A step group of
    one turn, or of equal returns, gives 0. Both levels divide by their group's std
    (``norm_by_std``, F_norm = std) or not (F_norm = 1, verl-agent's default). Every token of the
    turn gets it."""
    _check_group_inputs("gigpo_advantages", scores, group_ids, mask)
    turns = Turns(mask)
    if tuple(states.shape) != (mask.shape[0], turns.n):
        raise ValueError(f"gigpo_advantages: states must be (B, K)={(mask.shape[0], turns.n)}, "
                         f"got {tuple(states.shape)}")
    episode = grpo_advantages(scores, group_ids, torch.ones_like(scores).unsqueeze(-1), norm_by_std)[:, 0]
    rewards = turns.sum(token_rewards)
    returns = torch.zeros_like(rewards)
    following = rewards.new_zeros(rewards.shape[0])
    for k in reversed(range(turns.n)):
        following = _keep(rewards[:, k] + gamma * following, turns.present[:, k])
        returns[:, k] = following
    step = torch.zeros_like(rewards)
    where = turns.present
    if bool(where.any()):
        pairs = torch.stack([group_ids.unsqueeze(-1).expand_as(states)[where], states[where]], dim=1)
        step_groups = torch.unique(pairs, dim=0, return_inverse=True)[1]  # (group, state)
        size, mean, std, flat = _group_stats(returns[where], step_groups)
        adv = returns[where].double() - mean
        if norm_by_std:
            adv = adv / (std + EPS)
        step[where] = torch.where(flat | (size < 2), torch.zeros_like(adv), adv).float()
    return turns.spread(episode.unsqueeze(-1) + step_weight * step)


def _group_stats(
    scores: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (B,) group size, group mean, unbiased group std, and 'all scores equal'."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    s = scores.double()  # float64 so means of equal scores come back exactly equal
    size = torch.zeros(n_groups, dtype=s.dtype, device=s.device)
    size.index_add_(0, inverse, torch.ones_like(s))
    mean = torch.zeros_like(size).index_add_(0, inverse, s) / size
    sq = torch.zeros_like(size).index_add_(0, inverse, (s - mean[inverse]) ** 2)
    std = torch.sqrt(sq / (size - 1).clamp_min(1))
    hi = torch.full_like(size, -torch.inf).scatter_reduce_(0, inverse, s, "amax")
    lo = torch.full_like(size, torch.inf).scatter_reduce_(0, inverse, s, "amin")
    return size[inverse], mean[inverse], std[inverse], (hi == lo)[inverse]


def _broadcast(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) -> (B, T) float32: the row's value on every masked-in position, 0 elsewhere."""
    return _keep(per_row.float().unsqueeze(-1).expand(mask.shape), mask)


def _check_group_inputs(
    where: str, scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor
) -> None:
    if scores.shape != group_ids.shape or scores.shape != mask.shape[:1]:
        raise ValueError(
            f"{where}: scores {tuple(scores.shape)} and group_ids {tuple(group_ids.shape)} must be "
            f"(B,) with B = mask.shape[0] = {mask.shape[0]}"
        )


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor, norm_by_std: bool = True
) -> torch.Tensor:
    """GRPO: (score - group mean) [/ (group std + EPS)], broadcast over the mask -> (B, T).

    ``scores`` (B,) is one scalar per trajectory (its total reward); ``group_ids`` (B,) long
    marks trajectories of the same prompt. Groups of size 1, and groups whose scores are all
    equal, carry no signal and get exactly 0 (not rounding noise divided by a tiny std).
    """
    _check_group_inputs("grpo_advantages", scores, group_ids, mask)
    _, mean, std, flat = _group_stats(scores, group_ids)
    adv = scores.double() - mean
    if norm_by_std:
        adv = adv / (std + EPS)
    return _broadcast(torch.where(flat, torch.zeros_like(adv), adv), mask)


@torch.no_grad()
def rloo_advantages(scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """RLOO: score minus the mean of the OTHER scores of its group, broadcast -> (B, T).

    Equals ``n/(n-1) * (score - group mean)``; groups of size 1 get 0.
    """
    _check_group_inputs("rloo_advantages", scores, group_ids, mask)
    size, mean, _, flat = _group_stats(scores, group_ids)
    adv = size / (size - 1).clamp_min(1) * (scores.double() - mean)
    return _broadcast(torch.where(flat, torch.zeros_like(adv), adv), mask)


@torch.no_grad()
def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float,
                            whiten_mask: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE++: discounted return-to-go over masked-in positions, whitened over the batch
    (over ``whiten_mask``, the tokens that learn from them, when it is given; 0 outside it).

    Same skipping rule as ``compute_gae`` (it is GAE with V = 0 and lam = 1): environment
    tokens are absent, rewards on them are ignored. (B, T), (B, T) -> (B, T), 0 off the mask.
    """
    no_critic = torch.zeros(token_rewards.shape, dtype=torch.float32, device=token_rewards.device)
    returns_to_go, _ = compute_gae(token_rewards, no_critic, mask, gamma, lam=1.0)
    return masked_whiten(returns_to_go, mask if whiten_mask is None else whiten_mask)


# --------------------------------------------------------------------------- losses


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    per_trajectory: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, mean over the mask (:func:`loss_mean`): (B, T) x4 -> (scalar loss, metrics).

    ``ratio = exp(logp - old_logp)`` is clipped to ``[1 - clip_eps, 1 + clip_eps_high]``
    (``clip_eps_high`` defaults to ``clip_eps``; a larger one is DAPO's clip-higher).
    ``dual_clip_c`` (> 1) additionally caps the loss of negative-advantage tokens at
    ``-c * A`` so a huge ratio on a bad token cannot dominate (Ye et al. 2020).

    Metrics: ``pg_loss``, ``pg_clipfrac`` (fraction of tokens where the clipped branch is
    taken), ``ppo_kl`` (mean of old_logp - logp, an estimate of KL(old || new)), each averaged
    as the loss is.

    An all-zero mask gives loss exactly 0.0 with zero gradients; the trainer should still
    skip the optimizer step, since Adam's momentum from earlier steps would move weights.
    """
    _check_shapes("policy_loss", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"policy_loss: dual_clip_c must be > 1, got {dual_clip_c}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = _keep(logp - old_logp, mask).clamp(-PPO_LOG_RATIO_LIMIT, PPO_LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    adv = _keep(advantages.to(ratio.dtype), mask)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + high)
    losses = torch.maximum(unclipped, clipped)
    if dual_clip_c is not None:
        losses = torch.where(adv < 0, torch.minimum(losses, -dual_clip_c * adv), losses)
    loss = loss_mean(losses, mask, per_trajectory)
    metrics = {
        "pg_loss": loss.item(),
        "pg_clipfrac": loss_mean((clipped > unclipped).float(), mask, per_trajectory).item(),
        "ppo_kl": loss_mean(-log_ratio, mask, per_trajectory).item(),
    }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    per_trajectory: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v) - R)^2)``, masked mean (:func:`loss_mean`)
    -> (loss, metrics).

    ``clip(v) = old_v + clamp(v - old_v, -clip_eps, clip_eps)``. Metrics: ``vf_loss``,
    ``vf_clipfrac`` (fraction of tokens where the clipped branch is the larger). All masked:
    loss exactly 0.0, zero gradients.
    """
    _check_shapes("value_loss", values=values, old_values=old_values, returns=returns, mask=mask)
    v = _keep(values, mask)
    old = _keep(old_values.to(v.dtype), mask)
    target = _keep(returns.to(v.dtype), mask)
    v_clipped = old + (v - old).clamp(-clip_eps, clip_eps)
    unclipped = (v - target) ** 2
    clipped = (v_clipped - target) ** 2
    loss = 0.5 * loss_mean(torch.maximum(unclipped, clipped), mask, per_trajectory)
    metrics = {
        "vf_loss": loss.item(),
        "vf_clipfrac": loss_mean((clipped > unclipped).float(), mask, per_trajectory).item(),
    }
    return loss, metrics


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "k3", clamp: float = 10.0
) -> torch.Tensor:
    """Per-token KL estimate from sampled-token log probs: (B, T) -> (B, T).

    With r = ref_logp - logp on tokens sampled from pi: k1 = -r, k2 = r^2 / 2, k3 = exp(r) - r - 1
    (>= 0; Schulman 2020). As a *value* k1 and k3 are unbiased estimates of KL(pi || pi_ref), k2 a
    biased one with low variance. As a *loss* term (``kl_in_reward`` off) what counts is the
    expected gradient, and there they differ (Liu et al. 2025, "On a few pitfalls in KL
    divergence gradient estimation"; Zhang et al. 2025, GRPO's k3 in the loss): k1's is 0, so k1
    in the loss regularises nothing (``agentr1.recipe.ppo`` warns); k2's is the gradient of
    KL(pi || pi_ref); k3's is the gradient of the reverse KL(pi_ref || pi). In the reward
    (``kl_in_reward``) the estimate's value is what counts: k1 or k3.
    Clamped to [-clamp, clamp]. Not masked: reduce it with ``masked_mean`` (which ignores
    whatever stands in masked-out slots).
    """
    _check_shapes("kl_penalty", logp=logp, ref_logp=ref_logp)
    log_ratio = logp - ref_logp
    if kind == "k1":
        kl = log_ratio
    elif kind == "k2":
        kl = 0.5 * log_ratio**2
    elif kind == "k3":
        neg = (-log_ratio).clamp(-KL_LOG_RATIO_LIMIT, KL_LOG_RATIO_LIMIT)
        kl = torch.exp(neg) - neg - 1.0
    else:
        raise ValueError(f"kl_penalty: kind must be one of 'k1', 'k2', 'k3', got {kind!r}")
    return kl.clamp(-clamp, clamp)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over masked-in positions (1 = perfect critic, <= 0 = useless).

    Undefined when the returns do not vary; returns 0.0 then, so logged metrics stay finite.
    """
    _check_shapes("explained_variance", values=values, returns=returns, mask=mask)
    v = _keep(values.detach().float(), mask)
    r = _keep(returns.detach().float(), mask)
    var_r = masked_var(r, mask)
    if var_r <= 0:
        return 0.0
    return (1.0 - masked_var(r - v, mask) / var_r).item()
