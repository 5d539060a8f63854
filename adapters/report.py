"""What a person reads: Prefect artifacts (summary table, training progress), where the UIs are,
and the published numbers of a study regenerated from its MLflow runs (``agentr1 report``).

Artifact keys hold lowercase letters, digits and dashes (Prefect's rule); a key groups the
artifacts of every run of a flow on the UI's Artifacts page.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_PARENT_RUN_ID
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from agentr1.ablation import CURVE_KEYS
from agentr1.metrics import HEADLINE_KEYS
from agentr1.report import (BASELINE_LABELS, DIRTY, EXPORT_SUFFIX, STUDY_NAME, Provenance, RunRecord, Study,
                            export_text, read_export, render_study, variant_order)
from adapters import tracking

log = logging.getLogger("agentr1.report")

MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"
PREFECT_UI_DEFAULT = "http://127.0.0.1:4200"
MLFLOW_UI_ENV = "MLFLOW_UI_URL"
PERCENT = 100.0

# Rows of the summary table: the headline numbers first, then per-hop exact match.
SUMMARY_METRICS = (*HEADLINE_KEYS, "greedy/hops1/em", "greedy/hops2/em",
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
TAG_SOURCE_RUN = "agentr1.source_run_id"  # an imported run: the run of the export it stands for
TAG_IMPORTED_FROM = "agentr1.imported_from"  # an imported run: the export file's name
TAG_WARMUP_LABEL = "agentr1.warmup_label"  # an imported ablation parent: the warm-up as published
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
    run_id = run.data.tags.get(TAG_SOURCE_RUN) or run.info.run_id  # an imported run stands for its source
    return Provenance(run_id, commit, tag(tracking.TAG_DATA_HASH), tag(tracking.TAG_CONFIG_HASH))


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
    if TAG_WARMUP_LABEL in parent.data.tags:  # an imported study keeps the label it was published with
        return parent.data.tags[TAG_WARMUP_LABEL]
    given = parent.data.params.get("ablation.warmup")
    digest = parent.data.tags.get(tracking.TAG_WARMUP_DIGEST, "")[:8] or "no digest"
    origin = f"given {Path(given).name}" if given not in (None, "None") else f"seed {parent.data.params.get('seed')}"
    return f"{origin} ({digest})"


def _ablation_records(parent) -> list[RunRecord]:
    c = tracking.client()
    query = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}' and attributes.status = 'FINISHED'"
    records = []
    for run in tracking.search_all_runs([parent.info.experiment_id], query):
        tags = run.data.tags
        if "ablation.variant" not in tags:
            continue
        curve = [{"iteration": step, **point} for step, point in sorted(_history(run.info.run_id, CURVE_METRICS,
                                                                                  "curve/").items())]
        records.append(RunRecord(tags["ablation.variant"], _warmup_label(parent), int(tags["ablation.seed"]),
                                 _prefixed(run.data.metrics, "final/"), _provenance(run, parent), curve=curve,
                                 params=dict(run.data.params)))
    return records


def _suite_records(suite) -> list[RunRecord]:
    """A suite parent run's records: its tasks' ablation runs, each labelled with its task."""
    query = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{suite.info.run_id}' and attributes.status = 'FINISHED'"
    tasks = tracking.search_all_runs([suite.info.experiment_id], query)
    return [dataclasses.replace(rec, warmup=task.data.tags[tracking.TAG_SUITE_TASK])
            for task in tasks if tracking.TAG_SUITE_TASK in task.data.tags for rec in _ablation_records(task)]


def _pipeline_record(run) -> RunRecord:
    seed = int(run.data.params.get("seed", -1))
    m = run.data.metrics
    baselines = {b: _prefixed(m, f"eval/{b}/") for b in BASELINE_LABELS if any(k.startswith(f"eval/{b}/") for k in m)}
    history = [{"iteration": s, **p} for s, p in sorted(_history(run.info.run_id, HISTORY_METRICS).items())]
    return RunRecord("pipeline", f"seed {seed}", seed, _prefixed(m, "eval/final/"), _provenance(run),
                     start=_prefixed(m, "eval/warmup/"), baselines=baselines, history=history,
                     params=dict(run.data.params))


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
    runs = tracking.search_all_runs(ids, query) if ids else []
    if not runs:
        raise LookupError(f"no finished MLflow run is tagged {tracking.TAG_STUDY}={study} in {names} "
                          f"({tracking.tracking_uri()}); tag runs with `agentr1 ablate -o study={study}` or "
                          f"`agentr1 pipeline --study {study}`, or, for a published study, render its export "
                          f"(`agentr1 report --from docs/results/{study}.jsonl`) or load it into this store "
                          f"(`agentr1 report --import docs/results/{study}.jsonl`)")
    return runs


def _newest_per_cell(runs: list, records_of) -> list[RunRecord]:
    """The records of ``runs`` (newest first), one per cell (variant, warm-up, seed, config): an
    ablation or suite run again in the same directory (to add a seed, or just again) logs every
    cell anew, reused from disk, and counting both would weigh those cells twice."""
    seen: dict[tuple, str] = {}
    out = []
    for run in runs:
        for rec in records_of(run):
            cell = (rec.variant, rec.warmup, rec.seed, rec.provenance.config_hash)
            if cell in seen:
                log.info("study: %s seed %d (%s) of run %s is also in the newer run %s: counted once", rec.variant,
                         rec.seed, rec.warmup, run.info.run_id[:8], seen[cell][:8])
                continue
            seen[cell] = run.info.run_id
            out.append(rec)
    return out


def collect_study(study: str | None, run_ids: list[str] | None = None, command: str | None = None) -> Study:
    """A study's records from MLflow, in a canonical order (variant, warm-up, seed, run), so the
    export of the same runs is the same file whichever store they are read from."""
    runs = study_runs(study, run_ids)
    name = study or f"runs-{runs[0].info.run_id[:8]}"
    ablation_id = tracking.client().get_experiment_by_name(tracking.EXPERIMENTS["ablation"])
    is_ablation = ablation_id is not None and all(r.info.experiment_id == ablation_id.experiment_id for r in runs)
    suites = [r for r in runs if tracking.TAG_SUITE_PRESET in r.data.tags] if is_ablation else []
    runs = suites or runs  # a suite's study tag is on its run alone (its tasks' are <study>.<task>)
    kind = "suite" if suites else "ablation" if is_ablation else "pipeline"
    splits = sorted({r.data.params.get("eval.split", "test") for r in runs})
    if len(splits) > 1:  # the table is labelled with one split
        raise ValueError(f"study {name}: its runs were evaluated on different splits ({', '.join(splits)}); one "
                         "table would mix them: tag each split's runs as a study of its own")
    of_run = {"suite": _suite_records, "ablation": _ablation_records, "pipeline": lambda r: [_pipeline_record(r)]}[kind]
    records = _newest_per_cell(sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True), of_run)
    records.sort(key=lambda r: (variant_order([r.variant]), r.variant, r.warmup, r.seed, r.provenance.run_id))
    return Study(name, kind, splits[0],
                 command or f"agentr1 report --study {name}", records)


def write_study_report(study: str | None, out_dir: str | Path, run_ids: list[str] | None = None,
                       command: str | None = None, include: list[str] | None = None) -> dict[str, Path]:
    """The study's export ``<out_dir>/<name>.jsonl`` from its MLflow runs, then its markdown and plot
    rendered from that file (``agentr1.report.render_study``), as ``agentr1 report --from`` would."""
    found = collect_study(study, run_ids, command)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    export = out / f"{found.name}{EXPORT_SUFFIX}"
    export.write_text(export_text(found), encoding="utf-8")
    return {"export": export, **render_study(read_export(export), out, include or [], export)}


def import_study(path: str | Path) -> list[str]:
    """Runs in this MLflow store made from an export (``agentr1 report --import``), with the
    original runs' tags, parameters and metrics (curves and histories at their steps), so the UI
    compares a published study with one's own runs and ``agentr1 report --study`` on this store
    regenerates the same tables. Each run names the run it came from (``agentr1.source_run_id``).
    Returns the ids of the runs made."""
    from mlflow.entities import Metric, Param, RunStatus

    study = read_export(path)
    c = tracking.client()
    made: list[str] = []
    ids = [e.experiment_id for e in map(c.get_experiment_by_name, tracking.EXPERIMENTS.values()) if e is not None]
    there = c.search_runs(ids, f"tags.`{tracking.TAG_STUDY}` = '{study.name}' and "
                               f"tags.`{TAG_IMPORTED_FROM}` = '{Path(path).name}'", max_results=1) if ids else []
    if there:  # a second import would count every run twice in `report --study`
        raise ValueError(f"{path}: study {study.name!r} was imported into this store already (run "
                         f"{there[0].info.run_id}); nothing imported")

    def create(kind: str, name: str, rec: RunRecord | None, tags: dict, parent: str | None = None) -> str:
        prov = {}
        if rec is not None:
            commit = rec.provenance.git_commit or ""
            prov = {MLFLOW_GIT_COMMIT: commit.removesuffix(DIRTY) or None,
                    tracking.TAG_GIT_DIRTY: str(commit.endswith(DIRTY)).lower() if commit else None,
                    tracking.TAG_DATA_HASH: rec.provenance.data_hash,
                    tracking.TAG_CONFIG_HASH: rec.provenance.config_hash,
                    TAG_SOURCE_RUN: rec.provenance.run_id}
        all_tags = {tracking.TAG_STUDY: study.name, TAG_IMPORTED_FROM: Path(path).name, **prov, **tags,
                    MLFLOW_PARENT_RUN_ID: parent}
        run_id = c.create_run(tracking.experiment_id(tracking.EXPERIMENTS[kind]), run_name=name,
                              tags={k: str(v) for k, v in all_tags.items() if v is not None}).info.run_id
        made.append(run_id)
        return run_id

    def fill(run_id: str, rec: RunRecord, metrics: dict[str, float], series: dict[str, list[tuple[int, float]]]):
        params = [Param(k, v) for k, v in rec.params.items()]
        values = [Metric(k, v, 0, 0) for k, v in metrics.items() if math.isfinite(v)]
        values += [Metric(k, v, 0, step) for k, points in series.items() for step, v in points if math.isfinite(v)]
        for start in range(0, len(params), tracking.MAX_PARAMS_PER_BATCH):
            c.log_batch(run_id, params=params[start:start + tracking.MAX_PARAMS_PER_BATCH])
        for start in range(0, len(values), tracking.MAX_METRICS_PER_BATCH):
            c.log_batch(run_id, metrics=values[start:start + tracking.MAX_METRICS_PER_BATCH])
        c.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))

    if study.kind == "pipeline":
        for rec in study.records:
            metrics = {**_with_prefix(rec.final, "eval/final/"), **_with_prefix(rec.start, "eval/warmup/"),
                       **{k: v for b, m in rec.baselines.items() for k, v in _with_prefix(m, f"eval/{b}/").items()}}
            series = {k: [(int(h["iteration"]), h[k]) for h in rec.history if k in h] for k in HISTORY_METRICS}
            fill(create("pipeline", f"imported-{rec.provenance.run_id[:8]}", rec, {}), rec, metrics, series)
        return made
    suite = create("ablation", "imported-suite", None, {tracking.TAG_SUITE_PRESET: study.name}) \
        if study.kind == "suite" else None
    for warmup in sorted({r.warmup for r in study.records}):  # a suite's: its tasks
        members = [r for r in study.records if r.warmup == warmup]
        as_task = {tracking.TAG_SUITE_TASK: warmup, tracking.TAG_STUDY: f"{study.name}.{warmup}"} if suite else {}
        parent = create("ablation", f"imported-ablation-{len(made)}", None, {TAG_WARMUP_LABEL: warmup, **as_task},
                        suite)
        for rec in members:
            run = create("ablation", f"imported-{rec.variant}-seed{rec.seed}", rec,
                         {"ablation.variant": rec.variant, "ablation.seed": rec.seed,
                          **{k: v for k, v in as_task.items() if k == tracking.TAG_STUDY}}, parent)
            series = {f"curve/{k}": [(int(p["iteration"]), p[k]) for p in rec.curve if k in p] for k in CURVE_METRICS}
            fill(run, rec, _with_prefix(rec.final, "final/"), series)
        c.set_terminated(parent, RunStatus.to_string(RunStatus.FINISHED))
    if suite:
        c.set_terminated(suite, RunStatus.to_string(RunStatus.FINISHED))
    return made


def _with_prefix(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {prefix + k: v for k, v in metrics.items()}
