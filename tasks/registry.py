"""Registry tasks: register the trained policy, find and fetch registered versions, and move
the ``champion`` alias only when a challenger beats the champion on the same split.

The champion's score is not read back from its old run: it is evaluated again, now, on the
challenger's split and data version, so the two numbers compare like with like.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from agentr1.config import Config
from tasks import tracking

log = logging.getLogger("agentr1.tasks.registry")

MODELS_URI = "models:/"
DOWNLOADS_DIR = "registry"  # under the run directory: fetched registered policies
CHECKPOINT_LABEL = "checkpoint"


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
    return (name, ref, None) if ref.isdigit() else (name, None, ref)


def resolve_version(ref: str) -> tuple[str, str]:
    """``(name, version)`` of a registered model reference (an alias is looked up)."""
    from mlflow.exceptions import MlflowException

    name, version, alias = parse_model_ref(ref)
    try:
        found = (tracking.client().get_model_version_by_alias(name, alias) if alias is not None
                 else tracking.client().get_model_version(name, version))
    except MlflowException as exc:
        what = f"{name}@{alias}" if alias is not None else f"{name} version {version}"
        raise LookupError(f"model {ref!r}: no registered {what} in {tracking.tracking_uri()} "
                          f"({exc.error_code})") from None
    return name, str(found.version)


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


@task(name="register-policy", cache_policy=NO_CACHE)
def register_policy(cfg: Config, policy_dir: str, run_id: str) -> str:
    """Log ``policy_dir`` as the run's pyfunc model and register it; returns the new version."""
    uri = tracking.log_policy_model(run_id, policy_dir, cfg=cfg)
    version = tracking.register(uri, tracking.MODEL_NAME)
    tracking.set_tags(run_id, {"registered_version": version})
    return version


@task(name="fetch-model", cache_policy=NO_CACHE)
def fetch_model(ref: str, dest: str) -> tuple[str, str]:
    """``(label, local policy dir)`` of a policy directory or a registered reference."""
    label, path = resolve_policy(ref, dest)
    return label, str(path)


def compare(version: str, challenger: dict[str, float], champion_version: str | None,
            champion: dict[str, float] | None, metric: str, margin: float) -> Promotion:
    """Promote iff there is no champion, or ``challenger[metric] > champion[metric] + margin``."""
    score = challenger[metric]
    if champion_version is None or champion is None:
        return Promotion(version, True, None, version, metric, score, None, margin, "no champion yet")
    best = champion[metric]
    promoted = score > best + margin
    verdict = "beats" if promoted else "does not beat"
    reason = f"v{version} {metric}={score:.4f} {verdict} champion v{champion_version} {best:.4f} + margin {margin:g}"
    return Promotion(version, promoted, champion_version, version if promoted else champion_version, metric,
                     score, best, margin, reason)


@task(name="promote-if-better", cache_policy=NO_CACHE)
def promote_if_better(version: str, challenger: dict[str, float], champion_version: str | None,
                      champion: dict[str, float] | None, metric: str, margin: float,
                      run_id: str | None = None) -> Promotion:
    """Compare, move the ``champion`` alias when the challenger wins, and tag the run."""
    if metric not in challenger:
        raise KeyError(f"promotion metric {metric!r} not in the evaluation; e.g. {sorted(challenger)[:6]}")
    decision = compare(version, challenger, champion_version, champion, metric, margin)
    if decision.promoted:
        tracking.set_champion(tracking.MODEL_NAME, version)
    log.info("promotion: %s", decision.reason)
    if run_id:
        tracking.set_tags(run_id, {"promoted": decision.promoted, "promotion": decision.reason,
                                   "champion_version": decision.champion_after})
    return decision
