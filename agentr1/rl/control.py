"""What steers a PPO run from outside the update: the learning-rate warm-up, the adaptive KL
coefficient, the early stop, and the score a dev evaluation ranks checkpoints by.

Pure functions of the configuration and the run's per-iteration history, so a resumed run
computes them again from its checkpoint's history and goes on exactly as it would have.
"""
from __future__ import annotations

import math
from typing import Any

from agentr1.metrics import EM_KEYS

KL_STEP_CLIP = 0.2
"""The adaptive controller's proportional error is clipped to +-this (Ziegler et al. 2019)."""


def lr_warmup_factor(iteration: int, warmup_iters: int) -> float:
    """The factor on ``ppo.lr`` at 0-based ``iteration``: a linear rise over the first
    ``warmup_iters`` iterations (1/w, 2/w, ..., 1), then 1; 1 throughout when ``warmup_iters`` is 0."""
    return min(1.0, (iteration + 1) / warmup_iters) if warmup_iters else 1.0


def adapt_kl_coef(coef: float, kl: float, target: float, horizon: float) -> float:
    """The next KL coefficient of the adaptive controller of Ziegler et al. 2019 (TRL's
    ``AdaptiveKLController``, with the horizon counted in iterations instead of episodes):
    ``coef * (1 + clip(kl / target - 1, -0.2, 0.2) / horizon)``, so a KL above the target
    raises the penalty by at most ``0.2 / horizon`` per iteration and one below lowers it. A
    non-finite ``kl`` leaves the coefficient as it is (the run's guard reports the divergence)."""
    if not math.isfinite(kl):
        return coef
    error = max(-KL_STEP_CLIP, min(KL_STEP_CLIP, kl / target - 1.0))
    return coef * (1.0 + error / horizon)


def dev_score(metrics: dict[str, float], metric: str) -> float:
    """The number checkpoints are ranked by on dev: ``greedy/em``, ``sampled/em``, or ``em``, the
    mean of the two (both are what the run reports)."""
    if metric == "em":
        return sum(metrics[k] for k in EM_KEYS) / len(EM_KEYS)
    return metrics[metric]


DEV_SCORE = "dev/score"
"""The history key of a dev evaluation's score (present only in iterations that had one)."""


def stop_reason(history: list[dict[str, float]], ppo: Any, start_score: float = -math.inf) -> str | None:
    """Why the run should stop after its last iteration, or None to go on: the batch's KL to
    the reference above ``ppo.stop_kl``; bad tool calls per episode more than ``ppo.stop_bad_calls``
    above the first iteration's; or ``ppo.dev_patience`` dev evaluations in a row without a
    better score than the best before them, ``start_score`` (the warm-up's) included."""
    if not history:
        return None
    last = history[-1]
    kl = last.get("actor/ref_kl", 0.0)
    if ppo.stop_kl is not None and not kl <= ppo.stop_kl:
        return f"KL to the reference {kl:.4f} > ppo.stop_kl {ppo.stop_kl}"
    rise = last.get("rollout/n_bad_calls", 0.0) - history[0].get("rollout/n_bad_calls", 0.0)
    if ppo.stop_bad_calls is not None and rise > ppo.stop_bad_calls:
        return (f"bad tool calls per episode rose by {rise:.3f} since the first iteration "
                f"(> ppo.stop_bad_calls {ppo.stop_bad_calls})")
    if ppo.dev_patience:
        scores = [h[DEV_SCORE] for h in history if DEV_SCORE in h]
        best_before = start_score
        since = 0
        for s in scores:
            since = 0 if s > best_before else since + 1
            best_before = max(best_before, s)
        if since >= ppo.dev_patience:
            return f"{since} dev evaluations without a better {DEV_SCORE} than {best_before:.4f} (ppo.dev_patience)"
    return None
