"""Serve the deployments declared in ``prefect.yaml`` from this process (``make serve``).

``prefect deploy`` needs a work pool and a worker; serving needs neither: this process
registers every deployment of ``prefect.yaml`` (name, entrypoint, parameters, schedules,
tags) with the Prefect API and runs their flow runs itself, in subprocesses. Point it at a
server with ``PREFECT_API_URL`` (``make serve`` uses the one ``make ui`` starts).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from agentr1.presets import REPO_ROOT

PREFECT_YAML = REPO_ROOT / "prefect.yaml"


def deployment_specs(path: str | Path = PREFECT_YAML) -> list[dict[str, Any]]:
    """The ``deployments:`` entries of a prefect.yaml."""
    specs = (yaml.safe_load(Path(path).read_text()) or {}).get("deployments") or []
    for i, spec in enumerate(specs):
        for key in ("name", "entrypoint"):
            if not spec.get(key):
                raise ValueError(f"{path}: deployments[{i}]: '{key}' is required")
    return specs


def load_flow(entrypoint: str):
    """``"flows/pipeline.py:pipeline"`` -> the flow object (imported as ``flows.pipeline``)."""
    file, _, attr = entrypoint.partition(":")
    module = importlib.import_module(Path(file).with_suffix("").as_posix().replace("/", "."))
    return getattr(module, attr)


def to_deployment(spec: dict[str, Any], parameters: dict[str, Any] | None = None):
    """A runner deployment for one prefect.yaml entry (``parameters`` replace its defaults)."""
    from prefect.schedules import Schedule

    schedules = [Schedule(**s) for s in spec.get("schedules") or []]
    return load_flow(spec["entrypoint"]).to_deployment(
        name=spec["name"], description=spec.get("description"), tags=spec.get("tags"),
        parameters=spec.get("parameters") if parameters is None else parameters, schedules=schedules or None)


def main() -> None:
    from prefect import serve

    deployments = [to_deployment(s) for s in deployment_specs()]
    serve(*deployments)


if __name__ == "__main__":
    main()
