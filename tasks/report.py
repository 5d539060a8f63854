"""What a person reads: Prefect artifacts (summary table, training progress), where the UIs are,
and the published numbers of a study regenerated from its MLflow runs (``agentr1 report``).

Artifact keys hold lowercase letters, digits and dashes (Prefect's rule); a key groups the
artifacts of every run of a flow on the UI's Artifacts page.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_PARENT_RUN_ID
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from agentr1.ablation import CURVE_KEYS, VARIANTS, mean_curve
from agentr1.report import (BASELINE_LABELS, DIRTY, HEADLINE_KEYS, Provenance, RunRecord, variant_order,
                            ablation_table, baselines_table, ordering, ordering_markdown, pipeline_table,
                            provenance_markdown, provenance_summary, speed_claim, splice)
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


# -- studies: the published numbers, regenerated from MLflow -----------------------------------
STUDY_NAME = re.compile(r"^[\w.-]+$")
CURVE_METRICS = (*CURVE_KEYS, "train_seconds")
PIPELINE_EXPERIMENTS = ("pipeline", "retrain")
# What a pipeline run's learning-curve plot draws (agentr1.plots.plot_learning_curve).
HISTORY_METRICS = ("rollout/em", "reward/total", "actor/ref_kl", "actor/pg_clipfrac", "time/elapsed_s")


def _provenance(run, parent=None) -> Provenance:
    """A run's MLflow id, git commit, DVC data hash and config hash; what the run lacks comes
    from its parent (an ablation's nested runs share the flow run's data)."""
    def tag(key: str) -> str | None:
        return run.data.tags.get(key) or (parent.data.tags.get(key) if parent is not None else None)

    commit = tag(MLFLOW_GIT_COMMIT)
    if commit and run.data.tags.get(tracking.TAG_GIT_DIRTY) == "true":
        commit += DIRTY
    return Provenance(run.info.run_id, commit, tag(tracking.TAG_DATA_HASH), tag(tracking.TAG_CONFIG_HASH))


def _prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}


def _history(run_id: str, keys: tuple[str, ...], prefix: str = "") -> dict[int, dict[str, float]]:
    """step -> {key: value} of the runs' metric histories."""
    c = tracking.client()
    out: dict[int, dict[str, float]] = {}
    for key in keys:
        for m in c.get_metric_history(run_id, prefix + key):
            out.setdefault(int(m.step), {})[key] = m.value
    return out


def _warmup_label(parent) -> str:
    """The seed the flow's warm-up was trained with (or the warm-up it was given) and a digest
    of its weights: the report's warm-up factor."""
    given = parent.data.params.get("ablation.warmup")
    digest = parent.data.tags.get(tracking.TAG_WARMUP_DIGEST, "")[:8] or "no digest"
    origin = f"given {Path(given).name}" if given not in (None, "None") else f"seed {parent.data.params.get('seed')}"
    return f"{origin} ({digest})"


def _ablation_records(parent) -> list[RunRecord]:
    c = tracking.client()
    query = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}' and attributes.status = 'FINISHED'"
    records = []
    for run in c.search_runs([parent.info.experiment_id], query, max_results=tracking.SEARCH_MAX_RESULTS):
        tags = run.data.tags
        if "ablation.variant" not in tags:
            continue
        curve = [{"iteration": step, **point} for step, point in sorted(_history(run.info.run_id, CURVE_METRICS,
                                                                                  "curve/").items())]
        records.append(RunRecord(tags["ablation.variant"], _warmup_label(parent), int(tags["ablation.seed"]),
                                 _prefixed(run.data.metrics, "final/"), _provenance(run, parent), curve=curve))
    return records


def _pipeline_record(run) -> RunRecord:
    seed = int(run.data.params.get("seed", -1))
    m = run.data.metrics
    baselines = {b: _prefixed(m, f"eval/{b}/") for b in BASELINE_LABELS if any(k.startswith(f"eval/{b}/") for k in m)}
    return RunRecord("pipeline", f"seed {seed}", seed, _prefixed(m, "eval/final/"), _provenance(run),
                     start=_prefixed(m, "eval/warmup/"), baselines=baselines)


def study_runs(study: str | None = None, run_ids: list[str] | None = None) -> list:
    """The finished top-level runs of a study (tag ``agentr1.study``), or the runs named."""
    c = tracking.client()
    if run_ids:
        return [c.get_run(r) for r in run_ids]
    if not study or not STUDY_NAME.match(study):
        raise ValueError(f"study {study!r}: expected a name of letters, digits, '.', '_' or '-'")
    names = [tracking.EXPERIMENTS[k] for k in ("ablation", *PIPELINE_EXPERIMENTS)]
    ids = [e.experiment_id for e in (c.get_experiment_by_name(n) for n in names) if e is not None]
    query = f"tags.`{tracking.TAG_STUDY}` = '{study}' and attributes.status = 'FINISHED'"
    runs = c.search_runs(ids, query, max_results=tracking.SEARCH_MAX_RESULTS) if ids else []
    if not runs:
        raise LookupError(f"no finished MLflow run is tagged {tracking.TAG_STUDY}={study} in {names} "
                          f"({tracking.tracking_uri()}); tag runs with `agentr1 ablate -o study={study}` or "
                          f"`agentr1 pipeline --study {study}`")
    return runs


def write_study_report(study: str | None, out_dir: str | Path, run_ids: list[str] | None = None,
                       command: str | None = None, include: list[str] | None = None) -> dict[str, Path]:
    """``<out_dir>/<name>.md`` and ``<name>.png`` for a study: an ablation (its flow runs, one
    per warm-up: table with spread over warm-ups and over seeds, the paper's claims tested,
    learning curves) or repeated pipeline runs (EM before -> after RL per run, mean ± std,
    learning curves); every number with its MLflow run, git commit, data hash and config hash.
    The summary (tables, claims, provenance line) also goes between the study's markers in each
    ``include`` file (``agentr1.report.splice``)."""
    from agentr1.plots import plot_ablation_curves, plot_learning_curve

    runs = study_runs(study, run_ids)
    name = study or f"runs-{runs[0].info.run_id[:8]}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, png = out / f"{name}.md", out / f"{name}.png"
    ablation_id = tracking.client().get_experiment_by_name(tracking.EXPERIMENTS["ablation"])
    is_ablation = ablation_id is not None and all(r.info.experiment_id == ablation_id.experiment_id for r in runs)
    split = runs[0].data.params.get("eval.split", "test")
    command = command or f"agentr1 report --study {name}"
    lines = []
    if is_ablation:
        records = [rec for parent in runs for rec in _ablation_records(parent)]
        rl = {r.variant for r in records if VARIANTS.get(r.variant) and VARIANTS[r.variant].kind == "rl"}
        curves = {v: mean_curve([{"curve": r.curve} for r in records if r.variant == v and r.curve])
                  for v in variant_order(rl)}
        plot_ablation_curves({v: c for v, c in curves.items() if c}, png, split="dev",
                             title=f"study {name}: held-out exact match (mean ± std over all runs)")
        lines += [ablation_table(records, split=split), "",
                  "Spread: **± warm-ups** is the standard deviation across warm-ups of each warm-up's mean over "
                  "its PPO seeds; **± seeds** the standard deviation across PPO seeds from one warm-up, averaged "
                  "over the warm-ups (n/a: one warm-up, or one seed).", "",
                  "The paper's ordering, on greedy and sampled EM (a claim holds *beyond one standard deviation* "
                  "when the difference of means exceeds the larger of the two variants' standard deviations "
                  "over all their runs):", "",
                  ordering_markdown([c for key in HEADLINE_KEYS for c in ordering(records, key)]), "",
                  speed_claim(records), ""]
    else:
        records = [_pipeline_record(r) for r in runs]
        histories = {f"seed {r.data.params.get('seed')} ({r.info.run_id[:8]})":
                     [{"iteration": s, **p} for s, p in sorted(_history(r.info.run_id, HISTORY_METRICS).items())]
                     for r in runs}
        plot_learning_curve({k: h for k, h in histories.items() if h}, png, title=f"study {name}: masked PPO")
        lines += [pipeline_table(records, split=split), ""]
        if any(r.baselines for r in records):
            lines += ["The untrained model's baselines on the same questions, beside the warm-up and the "
                      "trained agent:", "", baselines_table(records, split=split), ""]
    lines.append(f"Generated by `{command}`. **Provenance**: {provenance_summary(records)}")
    summary = "\n".join(lines)
    md.write_text("\n".join([f"<!-- generated by `{command}`; do not edit by hand -->", "", summary, "",
                             f"![{name}]({png.name})", "", provenance_markdown(records), ""]))
    for path in include or []:  # links to the per-run table and the plot, relative to the including file
        here = Path(path).resolve().parent
        link, plot = (Path(os.path.relpath(p.resolve(), here)).as_posix() for p in (md, png))
        splice(path, name, f"{summary} Per run: [{md.name}]({link}).\n\n![{name}]({plot})")
    return {"markdown": md, "plot": png}
