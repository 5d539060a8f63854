"""What a person reads: Prefect artifacts (summary table, training progress) and where the UIs are.

Artifact keys hold lowercase letters, digits and dashes (Prefect's rule); a key groups the
artifacts of every run of a flow on the UI's Artifacts page.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from tasks import tracking

MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"
PREFECT_UI_DEFAULT = "http://127.0.0.1:4200"
MLFLOW_UI_ENV = "MLFLOW_UI_URL"
PERCENT = 100.0

# Rows of the summary table: the headline numbers first, then per-hop exact match.
SUMMARY_METRICS = ("greedy/em", "sampled/em", "greedy/f1", "sampled/f1", "greedy/hops1/em", "greedy/hops2/em",
                   "greedy/hops3/em", "greedy/n_calls", "greedy/support_recall", "greedy/format_ok")


def mlflow_ui_url() -> str:
    """``MLFLOW_UI_URL``, the tracking server when it is one, else ``mlflow ui``'s default address."""
    uri = tracking.tracking_uri()
    return os.environ.get(MLFLOW_UI_ENV) or (uri if uri.startswith("http") else MLFLOW_UI_DEFAULT)


def mlflow_ui_command() -> str:
    return f"mlflow ui --backend-store-uri {tracking.tracking_uri()} --port 5000"


def mlflow_run_url(run_id: str) -> str:
    experiment = tracking.client().get_run(run_id).info.experiment_id
    return f"{mlflow_ui_url().rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"


def prefect_ui_url() -> str | None:
    """The Prefect UI of the API this process talks to; None on the ephemeral API (no UI)."""
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    return api.removesuffix("/").removesuffix("/api") if api else None


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def metrics_table(columns: dict[str, dict[str, float]], keys: tuple[str, ...] = SUMMARY_METRICS) -> str:
    """A markdown table: one row per metric in ``keys`` present anywhere, one column per entry
    of ``columns`` (e.g. warm-up, final), plus ``gain`` (last minus first) for two columns."""
    names = list(columns)
    gain = len(names) == 2
    header = ["metric", *names, *(["gain"] if gain else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in keys:
        values = [columns[n].get(key) for n in names]
        if all(v is None for v in values):
            continue
        cells = [_fmt(v) for v in values]
        if gain:
            cells.append(_fmt(values[1] - values[0]) if None not in values else "")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass
class Progress:
    """A progress artifact (0-100 %) updated once per PPO iteration."""

    artifact_id: UUID
    total: int

    @classmethod
    def start(cls, key: str, total: int, description: str) -> "Progress":
        return cls(create_progress_artifact(0.0, key=key, description=description), total)

    def update(self, done: int, description: str) -> None:
        share = PERCENT * done / self.total if self.total else PERCENT
        update_progress_artifact(self.artifact_id, share, description=description)


def publish_summary(key: str, title: str, sections: list[str], run_id: str | None) -> str:
    """The run's markdown summary as a Prefect artifact (and as ``summary.md`` in MLflow)."""
    lines = [f"# {title}", ""]
    if run_id:
        lines += [f"**MLflow run**: [{run_id}]({mlflow_run_url(run_id)})  ", ""]
    text = "\n".join(lines + sections) + "\n"
    create_markdown_artifact(text, key=key, description=title)
    if run_id:
        tracking.log_text(run_id, text, "summary.md")
    return text
