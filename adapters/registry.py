"""The model registry as the project reads it: a model reference (a policy directory, a version
number, an alias such as ``champion``, a ``models:/`` URI) resolved to a version and fetched as a
policy directory, and the check that keeps a policy with non-finite weights, or from a run
marked diverged (``tracking.TAG_DIVERGED``), from ever becoming a version. Registering and moving
the champion alias are the Prefect tasks of ``tasks/registry.py``.
"""
from __future__ import annotations

import re
from pathlib import Path

from adapters import lifecycle, tracking
from agentr1.errors import EXIT_FAILED, NotFound, NotRegistered, UserError
from agentr1.rundir import VALUE_HEAD_FILE

MODELS_URI = "models:/"
CHECKPOINT_LABEL = "checkpoint"
WEIGHT_FILES = "*.safetensors"  # the policy (maybe sharded or a LoRA adapter) and value_head.safetensors


class RegistrationRefused(UserError, RuntimeError):
    """The policy may not be registered: non-finite weights, or its run diverged."""

    exit_status = EXIT_FAILED


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
    found = sorted(p.parent for p in download.rglob("config.json") if (p.parent / VALUE_HEAD_FILE).exists())
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
    why = lifecycle.diverged(run_id)
    if why is not None:
        raise RegistrationRefused(f"run {run_id} diverged ({why}); its policy {policy_dir} is not registered")
    bad = first_nonfinite_tensor(policy_dir)
    if bad is not None:
        raise RegistrationRefused(f"{bad} holds NaN/inf: policy {policy_dir} of run {run_id} is not registered")
