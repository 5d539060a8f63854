"""Training tasks: baselines, warm-up, the PPO iterations, the final checkpoint, evaluation.

Thin wrappers over :mod:`agentr1.recipe`. Tasks pass paths and run ids, never models. The PPO
task opens one :class:`~agentr1.recipe.ppo.PPOSession` (from the last checkpoint when there is one)
and runs the engine's loop, :func:`~agentr1.recipe.ppo.run_ppo`, the same one ``agentr1 train``
runs, with checkpoints on the config's schedule; before each update it stores the batch as a
versioned Parquet dataset under the run and validates that file with Great Expectations (a
nested task per iteration). A batch that fails validation stops the run before the update, so
the checkpoint on disk stays the last good one.

Run layout (``cfg.output_dir``): the trainer's (``warmup/``, ``checkpoints/last/``, ``final/``,
``eval_*.json``, ``trajectories_*.txt``) plus ``rollouts/iter-NNNN.parquet``.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from agentr1 import checkpoint as ckpt
from agentr1.config import Config, config_hash
from agentr1.recipe.evaluation import evaluate_dir, stage_baselines
from agentr1.recipe.outputs import write_final_policy, write_history
from agentr1.recipe.ppo import PPOSession, run_ppo
from agentr1.recipe.warmup import check_demonstrable, finished_warmup, warmup
from agentr1.recipe.workspace import Workspace
from agentr1.rollout.store import RolloutDatasetInfo
from agentr1.rundir import HISTORY_FILE, LAST_DIR, SELECTED_FILE, WARMUP_DIR, claim_run_dir
from adapters import traces, tracking
from tasks.data import publish_failure
from adapters.report import Progress
from adapters.validation import validate_rollouts

log = logging.getLogger("agentr1.tasks.training")

ROLLOUT_REPORT_KEY = "rollout-validation-report"
ROLLOUTS_DIR = "rollouts"

# Workspaces (data + search index + environment) are read-only and take seconds to build;
# the tasks of one flow run share them within the process instead of rebuilding per task.
_WORKSPACES: dict[tuple, Workspace] = {}
_WORKSPACES_LOCK = threading.Lock()  # tasks may be submitted to a thread pool


@dataclass(frozen=True)
class IterationResult:
    """What one PPO iteration leaves behind (paths and numbers only)."""

    iteration: int
    """Iterations completed, this one included (the MLflow step of its metrics)."""
    metrics: dict[str, float]
    checkpoint: str
    rollouts: str
    rollout_version: str


def _data_fingerprint(data_dir: Path) -> tuple:
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(data_dir.rglob("*.jsonl")))


def workspace(cfg: Config) -> Workspace:
    """``Workspace.build(cfg)``, shared by tasks with the same data, environment, rewards and
    device (what it is built from; the rest of ``cfg`` is the caller's own)."""
    data_dir = Path(cfg.data.dir)
    key = (cfg.data.model_dump_json(), cfg.env.model_dump_json(), cfg.reward.model_dump_json(), cfg.device,
           _data_fingerprint(data_dir) if data_dir.exists() else ())
    with _WORKSPACES_LOCK:
        if key not in _WORKSPACES:
            _WORKSPACES.clear()  # one dataset at a time: a stale one is never reused
            _WORKSPACES[key] = Workspace.build(cfg)
        return _WORKSPACES[key]


def metrics_logger(run_id: str | None):
    """A trainer ``log_metrics(metrics, step)`` callback writing to the MLflow run."""
    if not run_id:
        return None
    return lambda metrics, step: tracking.log_metrics(run_id, metrics, step=step)


@task(name="warm-up", cache_policy=NO_CACHE)
def warm_up(cfg: Config, run_id: str | None = None) -> str:
    """Supervised warm-up on noisy-expert transcripts; returns ``output_dir/warmup`` (reused
    when a previous attempt of this run finished it)."""
    out = Path(cfg.output_dir) / WARMUP_DIR
    ws = workspace(cfg)  # the data is checked before the run directory is touched
    check_demonstrable(cfg, ws)
    claim_run_dir(cfg.output_dir)
    if finished_warmup(cfg):
        log.info("reusing the warm-up checkpoint %s", out)
    else:
        warmup(cfg, ws, metrics_logger(run_id))
    return str(out)


@task(name="evaluate-baselines", cache_policy=NO_CACHE)
def evaluate_baselines(cfg: Config, run_id: str | None = None) -> dict[str, dict[str, float]]:
    """The untrained model's baselines (``eval.baselines``: zero-shot, naive RAG) on the evaluation
    split, logged as ``eval/<baseline>/...`` with their transcripts; {} when there are none."""
    if not cfg.eval.baselines:
        return {}
    ws = workspace(cfg)
    claim_run_dir(cfg.output_dir)
    results = stage_baselines(cfg, ws)
    if run_id:
        out = Path(cfg.output_dir)
        for name, metrics in results.items():
            tracking.log_metrics(run_id, metrics, step=0, prefix=f"eval/{name}/")
            tracking.log_artifacts(run_id, out / f"eval_{name}.json", out / f"trajectories_{name}.txt",
                                   artifact_path="evaluation")
    return results


@task(name="validate-rollouts", task_run_name="validate-rollouts-{iteration}", cache_policy=NO_CACHE)
def check_rollouts(path: str, max_length: int, bound: float, iteration: int) -> dict:
    """Great Expectations on one stored batch (rewards within ``[-bound, bound]``); a failure
    becomes the ``rollout-validation-report`` artifact and raises ``ValidationFailed``."""
    report = validate_rollouts(path, max_length=max_length, reward_bounds=(-bound, bound))
    if not report.success:
        publish_failure([report], ROLLOUT_REPORT_KEY, f"rollout batch of iteration {iteration} failed validation")
    return {"rows": report.n_rows, "checks": report.n_checks}


def rollouts_path(cfg: Config, iteration: int) -> Path:
    return Path(cfg.output_dir) / ROLLOUTS_DIR / f"iter-{iteration:04d}.parquet"


@task(name="ppo", cache_policy=NO_CACHE)
def ppo_iterations(cfg: Config, run_id: str | None = None, progress_key: str = "ppo-progress"
                   ) -> list[IterationResult]:
    """The PPO iterations still to do, in one session (:func:`~agentr1.recipe.ppo.run_ppo`, the loop of
    every entry point: a checkpoint every ``ppo.checkpoint_every`` and at the end; a rerun resumes
    from the last one). Each batch is stored as a versioned Parquet file and validated with Great
    Expectations before its update; metrics go to MLflow; a progress artifact follows the
    iterations. Returns the iterations run here."""
    from agentr1.rollout.store import write_rollouts

    session = PPOSession(cfg, workspace(cfg))
    total = cfg.ppo.iterations
    progress = Progress.start(progress_key, total, f"PPO iterations of {cfg.output_dir}")
    if session.done:
        progress.update(total, f"all {total} iterations were already in {cfg.output_dir}")
    stored: dict[int, RolloutDatasetInfo] = {}
    results: list[IterationResult] = []

    questions = {r.id: r.question for r in session.ws.split("train")} if cfg.ppo.trace_episodes else {}

    def store_and_validate(trajs, it: int) -> None:
        meta = {"run_id": run_id, "config_hash": config_hash(cfg), "iteration": it}
        stored[it] = write_rollouts(trajs, rollouts_path(cfg, it), it, meta)
        check_rollouts(str(stored[it].path), cfg.env.max_context_tokens, session.reward_bounds[1], it)
        if run_id and cfg.ppo.trace_episodes:
            traces.log_episodes(run_id, trajs, questions, cfg.ppo.trace_episodes,
                                {traces.TAG_KIND: "ppo", traces.TAG_ITERATION: str(it)})

    def after_iteration(s: PPOSession) -> None:
        it, m, batch = s.iteration, s.history[-1], stored.pop(s.iteration)
        if run_id:
            tracking.log_dataset(run_id, batch.path, name=f"rollouts-{it:04d}", context="rollouts",
                                 digest=batch.version)
            tracking.set_tags(run_id, {tracking.TAG_ROLLOUT_VERSION: batch.version})
        results.append(IterationResult(it, m, str(s.last), str(batch.path), batch.version))
        progress.update(it, f"iteration {it}/{total}: rollout EM {m['rollout/em']:.3f}, "
                            f"reward {m['reward/total']:.3f}, KL {m['actor/ref_kl']:.4f}")

    run_ppo(session, log_metrics=metrics_logger(run_id), before_update=store_and_validate,
            after_iteration=after_iteration)
    return results


@task(name="save-final-policy", cache_policy=NO_CACHE)
def save_final_policy(cfg: Config, run_id: str | None = None) -> str:
    """``final/``: the best policy on dev or the last (:func:`~agentr1.recipe.outputs.write_final_policy`),
    plus ``metrics.jsonl`` and ``learning_curve.png``; logged to the run as artifacts, the
    selected iteration as the metric ``final/iteration``."""
    out = Path(cfg.output_dir)
    last = out / LAST_DIR
    final = write_final_policy(cfg)
    curve = write_history(cfg, ckpt.load_state(last).get("history", []) if last.exists() else [])
    if run_id:
        selected = json.loads((final / SELECTED_FILE).read_text())
        tracking.log_metrics(run_id, {"iteration": selected["iteration"]}, step=0, prefix="final/")
        tracking.log_artifacts(run_id, out / HISTORY_FILE)
        if curve:
            tracking.log_plot(run_id, curve)
    return str(final)


@task(name="evaluate", task_run_name="evaluate-{tag}", cache_policy=NO_CACHE)
def evaluate_policy(cfg: Config, policy_dir: str, tag: str, split: str | None = None,
                    run_id: str | None = None) -> dict[str, float]:
    """Greedy and sampled episodes of the policy in ``policy_dir`` on ``split`` (default
    ``cfg.eval.split``); metrics go to MLflow as ``eval/{tag}/...``, the JSON and rendered
    trajectories as artifacts. Returns the flat metrics (``greedy/em``, ...). Weights this run
    directory already evaluated on the same data (``final/`` when the dev check kept the warm-up)
    reuse that evaluation (:func:`agentr1.recipe.evaluation.evaluate_dir`): no traces again."""
    ws = workspace(cfg)
    split = split or cfg.eval.split
    if split not in ws.splits:
        raise ValueError(f"{ws.data_dir}: no split {split!r}; available: {sorted(ws.splits)}")
    result = evaluate_dir(cfg, ws, policy_dir, tag, split)
    if run_id:
        out = Path(cfg.output_dir)
        tracking.log_metrics(run_id, result.metrics, step=0, prefix=f"eval/{tag}/")
        tracking.log_artifacts(run_id, out / f"eval_{tag}.json", out / f"trajectories_{tag}.txt",
                               artifact_path="evaluation")
        if result.trajectories:
            traces.log_episodes(run_id, result.trajectories["greedy"], {r.id: r.question for r in ws.split(split)},
                                cfg.eval.traces, {traces.TAG_KIND: "evaluation", traces.TAG_EVAL: tag,
                                                  traces.TAG_MODE: "greedy"})
    return result.metrics
