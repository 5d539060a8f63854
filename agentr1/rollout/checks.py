"""The rules a batch of rollouts must satisfy before PPO learns from it.

One definition, two users: the PPO loop checks every batch in memory before its update
(:func:`check_batch`, cheap: plain numpy over the episodes), and the Prefect flows run the same
rules as a Great Expectations suite on the stored Parquet table (``adapters/validation.py`` builds
its expectations from :data:`RULES` and its helper columns with :func:`episode_columns`).

A rule holds when a per-episode *column* lies in ``[lo, hi]``; a bound given as a string is a
parameter filled in per run (``max_length``, ``reward_lo``, ``reward_hi``).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from agentr1.errors import TrainingStopped

LOGPROB_TOL = 1e-4
"""Sampled tokens' log-probs must be <= 0; float32 rounding may put a certain one a hair above."""
MAX_VALUE_CHARS = 200
"""Display columns are cut to this many characters (a report shows them, not a debugger)."""
MAX_PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class RolloutRule:
    """One rule on a helper column of :func:`episode_columns`, with the words a report uses."""

    name: str
    rule: str
    """What must hold, in words; ``{param}`` placeholders name the run's bounds."""
    field: str
    """The field of the rollout table a person would look at."""
    column: str
    show: str
    """The display column shown for a failing episode."""
    lo: float | str | None = None
    hi: float | str | None = None


def _zero(name: str, rule: str, field: str, column: str, show: str) -> RolloutRule:
    return RolloutRule(name, rule, field, column, show, 0, 0)


RULES: tuple[RolloutRule, ...] = (
    _zero("lengths", "token_ids, action_mask and rollout_logprobs have the same length",
          "token_ids/action_mask/rollout_logprobs", "length_mismatch", "v_lengths"),
    _zero("mask_values", "action_mask holds only 0 and 1", "action_mask", "n_bad_mask_values", "v_mask"),
    _zero("prompt_masked", "no action token inside the prompt (action_mask[:prompt_len] == 0)", "action_mask",
          "n_prompt_actions", "v_mask"),
    RolloutRule("has_action", "each episode has at least one action token (action_mask == 1)", "action_mask",
                "n_action", "v_mask", lo=1),
    RolloutRule("max_length", "sequence length len(token_ids) <= {max_length}", "token_ids", "seq_len",
                "v_lengths", hi="max_length"),
    _zero("rewards_finite", "outcome_reward and process_rewards are finite (no NaN / inf)",
          "outcome_reward/process_rewards", "n_nonfinite_rewards", "v_rewards"),
    RolloutRule("outcome_bounds", "outcome_reward is in [{reward_lo}, {reward_hi}]", "outcome_reward",
                "outcome_reward", "v_rewards", "reward_lo", "reward_hi"),
    RolloutRule("process_low", "every process reward is >= {reward_lo}", "process_rewards", "process_min",
                "v_rewards", lo="reward_lo"),
    RolloutRule("process_high", "every process reward is <= {reward_hi}", "process_rewards", "process_max",
                "v_rewards", hi="reward_hi"),
    _zero("turns", "one process reward per turn (len(process_rewards) == len(turn_ends))", "process_rewards",
          "turn_mismatch", "v_turns"),
    _zero("turn_ends", "every turn_ends index points at an action token of the sequence", "turn_ends",
          "n_bad_turn_ends", "v_turns"),
    _zero("logprobs", "rollout_logprobs of action tokens are finite and <= 0", "rollout_logprobs",
          "n_bad_logprobs", "v_logprobs"),
)

EPISODE_FIELDS = ("token_ids", "action_mask", "rollout_logprobs", "prompt_len", "turn_ends", "process_rewards",
                  "outcome_reward")
"""What :func:`episode_columns` reads of an episode (a Trajectory's attributes or a table row)."""


class RolloutBatchError(TrainingStopped, ValueError):
    """A batch of rollouts broke a rule; nothing was learnt from it."""


def reward_bound(weights: Mapping[str, object], max_turns: int) -> float:
    """No reward of an episode can exceed, in size, every weight at once on every turn: the bound
    rollouts are checked against, so that it follows the configured weights."""
    sizes = [abs(v) for v in weights.values() if isinstance(v, float)]
    return max(1.0, sum(sizes)) * max_turns


def _floats(values) -> np.ndarray:
    return np.asarray([math.nan if v is None else v for v in values or []], dtype=np.float64)


def _ints(values) -> np.ndarray:
    # A null inside a list is not a valid mask value: -1 makes it fail the 0/1 check.
    return np.asarray([-1 if v is None else v for v in values or []], dtype=np.int64)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _fmt(values: np.ndarray) -> str:
    # float32 columns read back as float64: 6 significant digits hide the rounding noise.
    return "[" + ", ".join(f"{v:.6g}" for v in values.tolist()) + "]"


def episode_columns(r: Mapping) -> dict:
    """Helper columns (what :data:`RULES` bound) and display columns (``v_*``) of one episode,
    given as a mapping of :data:`EPISODE_FIELDS` (a missing or null field reads as empty)."""
    tok, mask, lp = r.get("token_ids") or [], _ints(r.get("action_mask")), _floats(r.get("rollout_logprobs"))
    ends, proc = _ints(r.get("turn_ends")), _floats(r.get("process_rewards"))
    prompt_len = int(r.get("prompt_len") or 0)
    outcome = math.nan if r.get("outcome_reward") is None else float(r["outcome_reward"])
    rewards = np.append(proc, outcome)
    finite = proc[np.isfinite(proc)]
    n = len(tok)
    # Turn ends must land inside the sequence, on a sampled token (where the reward goes).
    inside = ends[(ends >= prompt_len) & (ends < min(n, len(mask)))]
    n_bad_ends = len(ends) - len(inside) + int(np.sum(mask[inside] != 1))
    acting = np.flatnonzero(mask[: len(lp)] == 1)
    bad_lp = acting[~(np.isfinite(lp[acting]) & (lp[acting] <= LOGPROB_TOL))]
    return {
        "length_mismatch": max(abs(len(mask) - n), abs(len(lp) - n)), "seq_len": n,
        "v_lengths": f"token_ids={n}, action_mask={len(mask)}, rollout_logprobs={len(lp)}",
        "n_bad_mask_values": int(np.sum((mask != 0) & (mask != 1))),
        "n_prompt_actions": int(np.sum(mask[:prompt_len] != 0)), "n_action": int(np.sum(mask == 1)),
        "v_mask": f"prompt_len={prompt_len}, action tokens={int(np.sum(mask == 1))}, "
                  f"values={sorted(set(mask.tolist()))}",
        "n_nonfinite_rewards": int(np.sum(~np.isfinite(rewards))),
        "outcome_reward": outcome,
        "process_min": float(finite.min()) if len(finite) else math.nan,
        "process_max": float(finite.max()) if len(finite) else math.nan,
        "v_rewards": _clip(f"outcome={outcome:.6g}, process={_fmt(proc)}"),
        "turn_mismatch": abs(len(proc) - len(ends)), "n_bad_turn_ends": n_bad_ends,
        "v_turns": _clip(f"prompt_len={prompt_len}, turn_ends={ends.tolist()}, process_rewards={len(proc)}"),
        "n_bad_logprobs": len(bad_lp),
        "v_logprobs": _clip(", ".join(f"position {j}: {lp[j]:.6g}" for j in bad_lp.tolist())),
    }


def _bound(value: float | str | None, params: Mapping[str, float]) -> float | None:
    return params[value] if isinstance(value, str) else value


def broken_rules(columns: Mapping, params: Mapping[str, float]) -> list[RolloutRule]:
    """The rules one episode's columns break. A NaN column is skipped, as GX skips nulls: the
    values that could be NaN (rewards) have a finiteness rule of their own."""
    broken = []
    for rule in RULES:
        v, lo, hi = columns[rule.column], _bound(rule.lo, params), _bound(rule.hi, params)
        if isinstance(v, float) and math.isnan(v):
            continue
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            broken.append(rule)
    return broken


def check_batch(episodes: Iterable, max_length: int, reward_bounds: tuple[float, float]) -> None:
    """Raise :class:`RolloutBatchError` naming the broken rules and the first offending episodes
    when any episode (a ``Trajectory`` or anything with the :data:`EPISODE_FIELDS` attributes)
    breaks a rule, or when the batch is empty."""
    params = {"max_length": max_length, "reward_lo": reward_bounds[0], "reward_hi": reward_bounds[1]}
    problems, n = [], 0
    for i, ep in enumerate(episodes):
        n += 1
        cols = episode_columns({f: getattr(ep, f) for f in EPISODE_FIELDS})
        for rule in broken_rules(cols, params):
            problems.append(f"episode {i} ({getattr(ep, 'record_id', '?')}): {rule.rule.format(**params)} "
                            f"[{rule.field}: {cols[rule.show]}]")
    if n == 0:
        raise RolloutBatchError("the rollout batch is empty")
    if problems:
        shown = "\n  ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = f"\n  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more" if len(problems) > MAX_PROBLEMS_SHOWN else ""
        raise RolloutBatchError(f"{len(problems)} rollout rule violation(s) in a batch of {n}:\n  {shown}{more}")
