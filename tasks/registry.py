"""Registry tasks: register the trained policy, find and fetch registered versions, and move
the ``champion`` alias only when a challenger beats the champion on the same split.

The champion's score is not read back from its old run: it is evaluated again, now, on the
challenger's split and data version, so the two numbers compare like with like.

That evaluation is slow, and another flow may move the alias meanwhile, so the decision is
taken again at the moment of the move: under the store lock the alias is read, compared and
set as one step (compare-and-set), and the run's tags and summary say what the registry holds
afterwards, never what this run believed before.

A policy is registered only when every tensor in its safetensors files is finite and its run
was not marked diverged (``tracking.TAG_DIVERGED``): a NaN policy must never become a version,
let alone the champion.
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from agentr1.config import Config
from agentr1.errors import EXIT_FAILED, NotFound, NotRegistered, UserError
from tasks import tracking

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger("agentr1.tasks.registry")

MODELS_URI = "models:/"
CHECKPOINT_LABEL = "checkpoint"
WEIGHT_FILES = "*.safetensors"  # the policy (maybe sharded or a LoRA adapter) and value_head.safetensors
FINAL_EVAL = "eval/final/"  # where a training run logs its own policy's scores (tasks.training)
# Params that shape an evaluation's number: two runs' scores compare only when these and the
# data version agree (the seed sets the sampled evaluation's draws; plug-ins define tools).
EVAL_PARAM_PREFIXES = ("eval.", "env.", "rollout.", "reward.", "seed", "plugins")


class RegistrationRefused(UserError, RuntimeError):
    """The policy may not be registered: non-finite weights, or its run diverged."""

    exit_status = EXIT_FAILED


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


_ALIAS = re.compile(r"[\w-]+")
"""What a registered alias or version may be (MLflow's rule for alias names)."""


def parse_model_ref(ref: str, name: str = tracking.MODEL_NAME) -> tuple[str, str | None, str | None]:
    """``"3"`` / ``"champion"`` / ``"models:/n/3"`` / ``"models:/n@champion"`` ->
    ``(name, version, alias)`` with exactly one of version and alias set."""
    body = ref.removeprefix(MODELS_URI)
    if ref.startswith(MODELS_URI):
        if "@" in body:
            name, alias = body.split("@", 1)
            return name, None, alias
        name, _, version = body.partition("/")
        return name, version, None
    if not _ALIAS.fullmatch(ref):  # MLflow's alias rule: a '/' or '.' means a path, and it is not there
        raise NotFound(f"model {ref!r}: no such directory; a model is a policy directory, a logged MLflow "
                       "model directory, or a registered one: a version number, an alias such as champion, "
                       f"or {MODELS_URI}NAME/VERSION")
    return (name, ref, None) if ref.isdigit() else (name, None, ref)


def qualified_ref(ref: str, name: str) -> str:
    """``ref`` with the registered model ``name`` spelled out (``"3"`` -> ``models:/name/3``,
    ``"champion"`` -> ``models:/name@champion``); a directory or a ``models:/`` URI is unchanged."""
    if ref.startswith(MODELS_URI) or Path(ref).is_dir():
        return ref
    _, version, alias = parse_model_ref(ref, name)
    return f"{MODELS_URI}{name}/{version}" if version is not None else f"{MODELS_URI}{name}@{alias}"


def resolve_version(ref: str) -> tuple[str, str]:
    """``(name, version)`` of a registered model reference (an alias is looked up)."""
    from mlflow.exceptions import MlflowException

    name, version, alias = parse_model_ref(ref)
    try:
        found = (tracking.client().get_model_version_by_alias(name, alias) if alias is not None
                 else tracking.client().get_model_version(name, version))
    except MlflowException as exc:
        what = f"{name}@{alias}" if alias is not None else f"{name} version {version}"
        raise NotRegistered(f"model {ref!r}: no registered {what} in {tracking.tracking_uri()} ({exc.error_code}); "
                            "train and register one with `agentr1 pipeline`, or set MLFLOW_TRACKING_URI to the "
                            "store that has it") from None
    return name, str(found.version)


def model_uri(ref: str) -> str:
    """``models:/<name>/<version>`` of a registered model reference (an alias is resolved now,
    so the caller loads the version the alias names at this moment)."""
    name, version = resolve_version(ref)
    return f"{MODELS_URI}{name}/{version}"


def policy_dir_of(download: Path) -> Path:
    """The Hugging Face policy directory inside a downloaded pyfunc model."""
    found = sorted(p.parent for p in download.rglob("config.json") if (p.parent / "value_head.safetensors").exists())
    if not found:
        raise FileNotFoundError(f"{download}: no policy directory (config.json + value_head.safetensors) inside")
    return found[0]


def fetch_policy(ref: str, dest: str | Path) -> tuple[str, Path]:
    """``(version, local policy dir)`` of a registered model reference, downloaded under ``dest``."""
    import mlflow

    name, version = resolve_version(ref)
    tracking.client()  # points MLflow's global URI at the project store
    target = Path(dest) / f"{name}-v{version}"
    target.mkdir(parents=True, exist_ok=True)
    mlflow.artifacts.download_artifacts(artifact_uri=f"{MODELS_URI}{name}/{version}", dst_path=str(target))
    return version, policy_dir_of(target)


def resolve_policy(ref: str, dest: str | Path) -> tuple[str, Path]:
    """A policy directory given as a path, or a registered reference fetched under ``dest``;
    returns ``(label, dir)`` where label is ``checkpoint`` or ``v<version>``."""
    if Path(ref).is_dir():
        return CHECKPOINT_LABEL, Path(ref)
    version, path = fetch_policy(ref, dest)
    return f"v{version}", path


def first_nonfinite_tensor(policy_dir: str | Path) -> str | None:
    """``"<file>: <tensor>"`` of the first tensor holding NaN/inf in the safetensors files of
    ``policy_dir``; None when all are finite. (safetensors holds tensors only: reading it
    runs no code.)"""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(policy_dir).glob(WEIGHT_FILES))
    if not files:
        raise FileNotFoundError(f"{policy_dir}: no {WEIGHT_FILES} weight files to check")
    for file in files:
        for name, tensor in load_file(str(file)).items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return f"{file}: {name}"
    return None


def check_registrable(policy_dir: str | Path, run_id: str) -> None:
    """Raise :class:`RegistrationRefused` when run ``run_id`` was marked diverged or a weight
    in ``policy_dir`` is not finite."""
    why = tracking.diverged(run_id)
    if why is not None:
        raise RegistrationRefused(f"run {run_id} diverged ({why}); its policy {policy_dir} is not registered")
    bad = first_nonfinite_tensor(policy_dir)
    if bad is not None:
        raise RegistrationRefused(f"{bad} holds NaN/inf: policy {policy_dir} of run {run_id} is not registered")


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
