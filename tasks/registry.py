"""Registry tasks: register the trained policy, fetch a model for evaluation, and move the
``champion`` alias only when a challenger beats the champion on the same split (how references
resolve and what may be registered: ``adapters/registry.py``).

The champion's score is not read back from its old run: it is evaluated again, now, on the
challenger's split and data version, so the two numbers compare like with like.

That evaluation is slow, and another flow may move the alias meanwhile, so the decision is
taken again at the moment of the move: under the store lock the alias is read, compared and
set as one step (compare-and-set), and the run's tags and summary say what the registry holds
afterwards, never what this run believed before.

A policy is registered only when every tensor in its safetensors files is finite and its run
was not marked diverged: a NaN policy must never become a version, let alone the champion.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from agentr1.config import Config
from adapters import tracking
from adapters.registry import check_registrable, resolve_policy

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger("agentr1.tasks.registry")

FINAL_EVAL = "eval/final/"  # where a training run logs its own policy's scores (tasks.training)
# Params that shape an evaluation's number: two runs' scores compare only when these and the
# data version agree (the seed sets the sampled evaluation's draws; plug-ins define tools).
EVAL_PARAM_PREFIXES = ("eval.", "env.", "rollout.", "reward.", "seed", "plugins")


@dataclass(frozen=True)
class Promotion:
    """The outcome of comparing a new version with the champion."""

    version: str
    promoted: bool
    champion_before: str | None
    champion_after: str | None
    metric: str
    challenger_score: float
    champion_score: float | None
    margin: float
    reason: str


@task(name="register-policy", cache_policy=NO_CACHE)
def register_policy(cfg: Config, policy_dir: str, run_id: str) -> str:
    """Log ``policy_dir`` as the run's pyfunc model and register it; returns the new version.
    Refuses (:class:`RegistrationRefused`, nothing logged) a policy with non-finite weights or
    from a run marked diverged."""
    check_registrable(policy_dir, run_id)
    uri = tracking.log_policy_model(run_id, policy_dir, cfg=cfg)
    version = tracking.register(uri, tracking.model_name(cfg.env.kind))
    tracking.set_tags(run_id, {"registered_version": version})
    return version


@task(name="fetch-model", cache_policy=NO_CACHE)
def fetch_model(ref: str, dest: str) -> tuple[str, str]:
    """``(label, local policy dir)`` of a policy directory or a registered reference."""
    label, path = resolve_policy(ref, dest)
    return label, str(path)


def compare(version: str, challenger: dict[str, float], champion_version: str | None,
            champion: dict[str, float] | None, metric: str, margin: float) -> Promotion:
    """Promote iff the challenger's score is finite and there is no champion, or
    ``challenger[metric] > champion[metric] + margin`` (a champion without a finite score is beaten
    by any finite one: NaN compares False, so it could never be replaced)."""
    score = challenger[metric]
    if not math.isfinite(score):
        return Promotion(version, False, champion_version, champion_version, metric, score, None, margin,
                         f"v{version} {metric}={score}: not a finite score, never promoted")
    if champion_version is None or champion is None:
        return Promotion(version, True, None, version, metric, score, None, margin, "no champion yet")
    best = champion[metric]
    promoted = score > best + margin or not math.isfinite(best)
    verdict = "beats" if promoted else "does not beat"
    reason = f"v{version} {metric}={score:.4f} {verdict} champion v{champion_version} {best:.4f} + margin {margin:g}"
    return Promotion(version, promoted, champion_version, version if promoted else champion_version, metric,
                     score, best, margin, reason)


def logged_score(run_id: str, metric: str, like_run_id: str | None) -> tuple[float | None, str]:
    """The score run ``run_id`` logged for its own final policy (``eval/final/<metric>``), when
    it was measured like run ``like_run_id``'s (same data version and evaluation settings);
    else ``(None, why not)``."""
    c = tracking.client()
    theirs = c.get_run(run_id).data
    score = theirs.metrics.get(FINAL_EVAL + metric)
    if score is None:
        return None, f"its run {run_id} logged no {FINAL_EVAL}{metric}"
    if like_run_id is None:
        return None, "this run's settings are unknown (no run id)"
    ours = c.get_run(like_run_id).data
    if theirs.tags.get(tracking.TAG_DATA_HASH) != ours.tags.get(tracking.TAG_DATA_HASH):
        return None, "it was evaluated on another data version"

    def settings(params: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in params.items() if k.startswith(EVAL_PARAM_PREFIXES)}

    differ = sorted(k for k in settings(theirs.params).keys() | settings(ours.params).keys()
                    if theirs.params.get(k) != ours.params.get(k))
    if differ:
        return None, f"it was evaluated with other settings ({', '.join(differ[:3])})"
    return score, ""


def decide(version: str, challenger: dict[str, float], evaluated: str | None, evaluated_scores: dict[str, float] | None,
           current: ModelVersion | None, metric: str, margin: float, run_id: str | None) -> Promotion:
    """The decision against ``current``, the champion the registry holds now (None: none), for
    run ``run_id``'s challenger ``version``. When it is the one evaluated (``evaluated``,
    scored ``evaluated_scores``), that fresh evaluation decides. When the alias moved while that evaluation
    ran, the new champion's own logged score stands in if it was measured like ours; if not,
    the new champion is kept (it won its own challenge; a later retrain can challenge it)."""
    now = None if current is None else str(current.version)
    if now == evaluated:
        return compare(version, challenger, evaluated, evaluated_scores, metric, margin)
    looked = f"evaluated v{evaluated}" if evaluated else "trained (there was none when it looked)"
    moved = (f"the champion alias was removed while this run evaluated v{evaluated}" if now is None
             else f"the champion became v{now} while this run {looked}")
    if current is None:
        decision = compare(version, challenger, None, None, metric, margin)
        return replace(decision, reason=f"{decision.reason} ({moved})")
    score, why_not = logged_score(current.run_id, metric, run_id)
    if score is None:
        return Promotion(version, False, now, now, metric, challenger[metric], None, margin,
                         f"{moved}; v{now} is kept: {why_not}, so the two cannot be compared")
    decision = compare(version, challenger, now, {metric: score}, metric, margin)
    return replace(decision, reason=f"{decision.reason} (its logged score; {moved})")


@task(name="promote-if-better", cache_policy=NO_CACHE)
def promote_if_better(version: str, challenger: dict[str, float], champion_version: str | None,
                      champion: dict[str, float] | None, metric: str, margin: float,
                      run_id: str | None = None, name: str = tracking.MODEL_NAME) -> Promotion:
    """Compare with the champion and move the ``champion`` alias when the challenger wins, as
    one compare-and-set under the store lock; tag the run with what the registry holds after.

    ``champion_version``/``champion``: the champion that was evaluated (None: there was none)
    and its scores; ``name``: the registered model (``tracking.model_name`` of the run's
    environment kind). Without a lock (a tracking server) the alias is read back after the move;
    if another run moved it in between, the result says so and reports the registry's value.
    """
    if metric not in challenger:
        raise KeyError(f"promotion metric {metric!r} not in the evaluation; e.g. {sorted(challenger)[:6]}")
    with tracking.store_lock():
        current = tracking.champion_entry(name)
        decision = decide(version, challenger, champion_version, champion, current, metric, margin, run_id)
        if decision.promoted:
            tracking.set_champion(name, version)
        held = tracking.champion_entry(name)
    held_version = None if held is None else str(held.version)
    if held_version != decision.champion_after:
        decision = replace(decision, champion_after=held_version,
                           reason=f"{decision.reason}; but another run moved the alias meanwhile: the registry's "
                                  f"champion is v{held_version}")
    log.info("promotion: %s", decision.reason)
    if run_id:
        tracking.set_tags(run_id, {"promoted": decision.promoted, "promotion": decision.reason,
                                   "champion_version": decision.champion_after})
    return decision
