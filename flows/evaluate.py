"""Evaluate a checkpoint directory or a registered policy (version or alias) on a split.

One MLflow run per flow run in experiment ``agentr1-evaluate``: the metrics (``eval/<label>/...``),
the rendered trajectories and a summary table; the same table is the flow's Prefect artifact.

    prefect deployment run 'evaluate/on-demand' -p params='{"model": "champion", "split": "dev"}'
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from agentr1.rundir import DOWNLOADS_DIR, claim_run_dir
from flows.pipeline import run_name, run_tags
from adapters import lifecycle, tracking
from tasks.data import prepare_data, validate_data
from agentr1.presets import DataSource
from flows.forms import EvaluateParams, resolve_config
from adapters.registry import qualified_ref
from tasks.registry import fetch_model
from adapters.report import SUMMARY_METRICS, metrics_table, publish_summary
from tasks.training import evaluate_policy


@flow(name="evaluate", description="Greedy and sampled evaluation of a checkpoint or a registered policy.")
def evaluate(params: EvaluateParams = EvaluateParams()) -> dict:
    """Evaluate ``params.model`` on ``params.split``; returns the flat metrics and where they went."""
    extra = [f"eval.max_examples={params.max_examples}"] if params.max_examples else []
    cfg = resolve_config(params, "evaluate", extra)
    with lifecycle.start_run(tracking.EXPERIMENTS["evaluate"], run_name("evaluate"), tags=run_tags()) as run_id:
        tracking.log_config(run_id, cfg)
        data = prepare_data(cfg, DataSource(version=False), run_id)
        validate_data(data)
        claim_run_dir(cfg.output_dir)  # writes eval_<label>.json and registry/ there: ours, or refused
        ref = qualified_ref(params.model, tracking.model_name(cfg.env.kind))  # "champion": of this config's environment
        label, policy_dir = fetch_model(ref, str(Path(cfg.output_dir) / DOWNLOADS_DIR))
        tracking.set_tags(run_id, {"model": params.model, "model_label": label, "split": params.split})
        metrics = evaluate_policy(cfg, policy_dir, label, split=params.split, run_id=run_id)
        sections = [f"Model `{params.model}` ({label}) on split `{params.split}` of `{data.path}` "
                    f"(DVC `{data.md5}`).", "", metrics_table({label: metrics}, SUMMARY_METRICS)]
        publish_summary("evaluate-summary", f"evaluate: {params.model} on {params.split}", sections, run_id)
    return {"run_id": run_id, "model": params.model, "label": label, "split": params.split,
            "output_dir": cfg.output_dir, "metrics": metrics}
