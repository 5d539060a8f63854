"""The end-to-end pipeline flow, and the training steps it shares with ``retrain``.

    data -> validate -> warm-up -> evaluate warm-up -> PPO iterations (rollouts stored and
    validated each time) -> final policy -> evaluate -> register -> champion alias if better

One MLflow run per flow run (experiment ``agentr1-pipeline``); the flow's Prefect artifacts
are a progress bar over the PPO iterations, a markdown summary with the metrics table and a
link to the MLflow run, and the validation report when a suite fails (the flow then fails
with nothing registered and no alias moved).

    agentr1 pipeline [--preset train] [-o ppo.iterations=5 ...]     # run it here
    make serve   # then press Run on deployment "pipeline/manual" in the Prefect UI
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from agentr1.config import Config
from agentr1.metrics import HEADLINE_KEYS
from agentr1.recipe.outputs import final_selection, write_summary
from agentr1.rl.guard import TrainingDiverged
from agentr1.rundir import DOWNLOADS_DIR
from adapters import lifecycle, tracking
from tasks.data import DataVersion, prepare_data, validate_data
from flows.forms import PipelineParams, TrainForm, resolve_config
from adapters.registry import qualified_ref
from tasks.registry import Promotion, fetch_model, promote_if_better, register_policy
from adapters.report import metrics_table, publish_summary
from tasks.training import (IterationResult, evaluate_baselines, evaluate_policy, ppo_iterations, save_final_policy,
                            warm_up)

SYSTEM_METRICS_INTERVAL_S = 10.0


@dataclass
class Candidate:
    """A trained policy and how it scored (paths and numbers only)."""

    output_dir: str
    data: DataVersion
    final_dir: str
    warmup: dict[str, float]
    final: dict[str, float]
    iterations: list[IterationResult]
    baselines: dict[str, dict[str, float]]

    @property
    def gain(self) -> dict[str, float]:
        return {k: self.final[k] - self.warmup[k] for k in HEADLINE_KEYS if k in self.final and k in self.warmup}


def run_name(kind: str) -> str:
    """``<kind>-<flow run name>`` (the Prefect run's name, so the two UIs cross-reference)."""
    name = flow_run.get_name()
    return f"{kind}-{name}" if name else kind


def run_tags() -> dict[str, str | None]:
    return {tracking.TAG_PREFECT_FLOW_RUN: flow_run.get_id(), "prefect_flow_run": flow_run.get_name()}


def crash_orphaned_flow_runs(experiment: str) -> list[str]:
    """Set Crashed the Prefect flow runs still Running whose process was killed (kill -9, out of
    memory: nothing in it could report): :func:`adapters.lifecycle.start_run` has just found their
    MLflow runs orphaned on this host (process gone) and ended them KILLED. Returns their ids.
    (A deployment's runs can also be watched by Prefect's own heartbeat automation.)"""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    crashed = []
    with get_client(sync_client=True) as client:
        for fid in lifecycle.flow_runs_of_orphaned_runs(experiment):
            try:
                state = client.read_flow_run(fid).state
            except (ObjectNotFound, ValueError):  # another Prefect server's run, or not an id
                continue
            if state is not None and state.is_running():
                client.set_flow_run_state(fid, Crashed(message="its process was killed; found by a later run"),
                                          force=True)
                crashed.append(fid)
    return crashed


def train_candidate(cfg: Config, form: TrainForm, run_id: str, kind: str) -> Candidate:
    """Data -> validation -> warm-up -> PPO -> final policy, each stage evaluated. A run that
    diverges is tagged so (``tracking.TAG_DIVERGED``) and fails: nothing of it is registered."""
    data = prepare_data(cfg, form.data, run_id)
    validate_data(data)
    baselines = evaluate_baselines(cfg, run_id)
    try:
        warm_dir = warm_up(cfg, run_id)
        before = evaluate_policy(cfg, warm_dir, "warmup", run_id=run_id)
        iterations = ppo_iterations(cfg, run_id, f"{kind}-ppo-progress")
    except TrainingDiverged as e:
        lifecycle.mark_diverged(run_id, str(e))
        raise
    final_dir = save_final_policy(cfg, run_id)
    after = evaluate_policy(cfg, final_dir, "final", run_id=run_id)
    return Candidate(cfg.output_dir, data, final_dir, before, after, iterations, baselines)


def challenge_champion(cfg: Config, version: str, scores: dict[str, float], form: PipelineParams,
                       run_id: str) -> Promotion:
    """Evaluate the current champion on the challenger's split and data, then promote or keep.

    The evaluation is slow and holds no lock; the move is a compare-and-set
    (``promote_if_better``) that decides again if another run moved the alias meanwhile, and
    the decision it returns (what the summary and the run's tags show) is what the registry
    holds after the move."""
    name = tracking.model_name(cfg.env.kind)  # one registered model per environment kind
    current = tracking.champion(name)
    champion_version, champion_scores = None, None
    if current is not None:
        label, path = fetch_model(qualified_ref(current[0], name), str(Path(cfg.output_dir) / DOWNLOADS_DIR))
        champion_version = current[0]
        champion_scores = evaluate_policy(cfg, path, f"champion-{label}", run_id=run_id)
    return promote_if_better(version, scores, champion_version, champion_scores, form.metric, form.margin, run_id,
                             name)


def summary_sections(c: Candidate, version: str, decision: Promotion, name: str) -> list[str]:
    last = c.iterations[-1].rollout_version if c.iterations else "none"
    return [
        "## Test metrics before and after RL", "",
        metrics_table({**{name.replace("_", "-"): m for name, m in c.baselines.items()},
                       "warm-up": c.warmup, "final": c.final}), "",
        "## Registry", "",
        f"- `{name}` version **{version}**; champion now **v{decision.champion_after}** "
        f"({'promoted' if decision.promoted else 'kept'}: {decision.reason})", "",
        "## Lineage", "",
        f"- data: `{c.data.path}` DVC `{c.data.md5}`{' (new version recorded)' if c.data.recorded else ''}",
        f"- rollouts: {len(c.iterations)} batches under `{Path(c.output_dir) / 'rollouts'}`, last version `{last}`",
        f"- run directory: `{c.output_dir}`",
    ]


def run_training_flow(kind: str, form: PipelineParams) -> dict:
    """Shared body of ``pipeline`` and ``retrain``: train, evaluate, register, challenge."""
    cfg = resolve_config(form, kind)
    tags = {**run_tags(), tracking.TAG_STUDY: form.study}
    with lifecycle.start_run(tracking.EXPERIMENTS[kind], run_name(kind), tags=tags,
                            system_metrics_interval=SYSTEM_METRICS_INTERVAL_S) as run_id:
        crash_orphaned_flow_runs(tracking.EXPERIMENTS[kind])
        tracking.log_config(run_id, cfg)
        cand = train_candidate(cfg, form, run_id, kind)
        version = register_policy(cfg, cand.final_dir, run_id)
        decision = challenge_champion(cfg, version, cand.final, form, run_id)
        tracking.log_metrics(run_id, cand.gain, step=0, prefix="gain/")
        name = tracking.model_name(cfg.env.kind)
        publish_summary(f"{kind}-summary", f"{kind}: {run_name(kind)}", summary_sections(cand, version, decision, name),
                        run_id)
    summary = {"run_id": run_id, "output_dir": cand.output_dir, "data": asdict(cand.data), "split": cfg.eval.split,
               "warmup": cand.warmup, "final": cand.final, "gain": cand.gain, "iterations": len(cand.iterations),
               "selected": final_selection(cand.final_dir),
               **({"baselines": cand.baselines} if cand.baselines else {}),
               "registered_model": name, "registered_version": version, "promotion": asdict(decision)}
    write_summary(cfg, summary)
    return summary


@flow(name="pipeline", description="End to end: data, validation, warm-up, masked PPO, evaluation, registry.")
def pipeline(params: PipelineParams = PipelineParams()) -> dict:
    """Train a policy end to end, register it, and make it the champion if none yet or better."""
    return run_training_flow("pipeline", params)
