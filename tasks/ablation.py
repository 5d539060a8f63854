"""Prefect tasks of the ablation flow: its preset, its task runner, the shared warm-up, one
(variant, seed) run as a nested MLflow run, and the report.

A preset (``conf/ablation/<name>.yaml``) is an :class:`AblationSpec`: a training preset plus
overrides (the config every variant starts from), the variants, the seeds, the learning-curve
cadence, the task runner and where results go. ``key=value`` overrides address the spec when
their first part is a spec field (``seeds=[0,1]``, ``runner.max_workers=2``, ``curve.every=5``,
``warmup=DIR``) and the training config otherwise (``ppo.iterations=10``, ``data.dir=...``).

Task runners: ``process`` (default; Prefect's ProcessPoolTaskRunner, one job per process, torch
threads split between them), ``sequential`` (one job at a time in this process) and ``dask``
(``prefect-dask``, the ``dask`` extra, imported only when chosen; ``runner.address`` names a
running scheduler, else a local cluster is started). On a cluster every worker needs this project
installed, the output directory on a shared filesystem and ``MLFLOW_TRACKING_URI`` pointing at a
tracking server (a local SQLite file cannot be shared). There is no ``ray`` kind: see
:data:`REMOVED_KINDS`.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, get_args

import yaml
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import Field, ValidationError, field_validator

from agentr1 import errors
from agentr1.ablation import (
    CURVE_KEYS,
    FINAL_TAG,
    FULL,
    VANILLA,
    VARIANTS,
    WARMUP_DIR,
    CurveSettings,
    Efficiency,
    Job,
    claim,
    curves_by_variant,
    curves_csv,
    efficiency,
    efficiency_markdown,
    efficiency_table,
    plan_jobs,
    read_jsonl,
    results_csv,
    results_markdown,
    run_job,
    summarize,
    write_json,
)
from agentr1.config import (
    Config,
    ConfigError,
    _format_validation_error,
    apply_overrides,
    config_hash,
    flatten,
    load_config,
)
from adapters import lifecycle, tracking
from agentr1.device import pin_threads
from agentr1.env.registry import resolve
from agentr1.presets import DataSource, Form, preset_path, spec_path
from agentr1.fsutil import write_text
from agentr1.rundir import ABLATION_REPORT, HISTORY_FILE, claim_run_dir
from agentr1.recipe.warmup import finished_warmup
from tasks.training import metrics_logger, warm_up, workspace

log = logging.getLogger("agentr1.tasks.ablation")

ABLATION_CONF = Path("conf") / "ablation"
DEFAULT_PRESET = "quick"
ROOT_FILE = "ablation.json"
REPORT_FILES, PLOT_FILE = ABLATION_REPORT[:-1], ABLATION_REPORT[-1]  # the tables, and the curves' plot


RunnerKind = Literal["process", "sequential", "dask"]
JudgedPolicy = Literal["last", "recipe"]
LAST_POLICY = ("ppo.dev_every=0",)
"""The training overrides of ``policy: last``, before the preset's own (which may still set it)."""
RUNNER_KINDS = get_args(RunnerKind)
# Kinds that once were, with why they went: an old preset gets the reason, not just the list.
REMOVED_KINDS = {"ray": "prefect-ray (a 79 MB ray wheel and 13 more packages) was never run by a test; for a "
                        "cluster use dask with runner.address=tcp://host:8786"}


class RunnerSettings(Form):
    """Where the (variant, seed) runs execute, in parallel."""

    kind: RunnerKind = "process"
    max_workers: int | None = Field(None, ge=1)
    """Runs at a time; None: CPU cores // threads_per_worker (or all cores)."""
    threads_per_worker: int | None = Field(None, ge=1)
    """Torch threads of each run; None: CPU cores // max_workers (at least 1)."""
    address: str | None = None
    """dask: the scheduler's address (``tcp://host:8786``); None starts a local cluster."""
    warmup_threads: int | None = Field(None, ge=1)
    """Torch threads of the warm-up (in the flow's own process, before the runs); None: torch's
    default, every core. On a busy machine fewer threads than cores avoid spinning-thread stalls."""

    @field_validator("kind", mode="before")
    @classmethod
    def _not_removed(cls, kind):
        if kind in REMOVED_KINDS:
            raise ValueError(f"{kind!r} is no longer a runner kind: {REMOVED_KINDS[kind]}; "
                             f"choose from {list(RUNNER_KINDS)}")
        return kind

    def resolved(self, cores: int | None = None) -> tuple[int, int]:
        """(workers, torch threads per run) on a machine with ``cores`` CPU cores."""
        cores = cores or os.cpu_count() or 1
        if self.kind == "sequential":
            return 1, self.threads_per_worker or cores
        workers = self.max_workers or max(1, cores // (self.threads_per_worker or 1))
        return workers, self.threads_per_worker or max(1, cores // workers)


class AblationSpec(Form):
    """An ablation preset (``conf/ablation/<name>.yaml``)."""

    base: str = Field("train", description="Training preset (a name in conf/, e.g. train for conf/train.yaml) or a YAML path that every variant starts from.")
    overrides: list[str] = Field(default_factory=list, description="key=value overrides of the training config.")
    variants: list[str] = Field(default_factory=lambda: list(VARIANTS), description="Variant names (agentr1.ablation).")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    group_size: int = Field(4, ge=2, description="Answers per question for GRPO and RLOO.")
    warmup: str | None = Field(None, description="An existing warm-up checkpoint to start from; None trains one.")
    curve: CurveSettings = Field(default_factory=CurveSettings)
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    source: DataSource = Field(default_factory=lambda: DataSource(version=False),
                               description="How to make data.dir if it is missing.")
    output_dir: str = Field("runs/ablation/default", description="Ablation root; re-running with it resumes.")
    study: str | None = Field(None, description="Tag the flow's runs as part of this study (`agentr1 report "
                              "--study`): one flow run per warm-up, the same study name.")
    policy: JudgedPolicy = Field("last", description="The policy each run is judged by: 'last' (PPO's last: what "
                                 "the variant learned; selection on dev would hide a variant that unlearns behind "
                                 "its warm-up; sets ppo.dev_every=0) or 'recipe' (what the training config does: "
                                 "its best on dev with ppo.dev_every).")

    @field_validator("variants")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
        if len(set(names)) != len(names) or not names:
            raise ValueError("variants must be a non-empty list without repeats")
        return names

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat: {seeds}")
        return seeds


# ----------------------------------------------------------------------------- spec


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(spec overrides, training-config overrides), by the key's first part."""
    spec, train = [], []
    for o in overrides:
        head = o.split("=", 1)[0].strip().split(".")[0]
        (spec if head in AblationSpec.model_fields else train).append(o)
    return spec, train


def load_spec(preset: str = DEFAULT_PRESET, overrides: list[str] | None = None,
              output_dir: str | None = None) -> AblationSpec:
    """The validated spec of a preset with overrides (a ConfigError names the bad key)."""
    path = spec_path(preset, ABLATION_CONF, "ablation preset")
    raw = yaml.safe_load(path.read_text()) or {}
    spec_over, train_over = split_overrides(list(overrides or []))
    raw = apply_overrides(raw, spec_over)
    raw["overrides"] = [*(raw.get("overrides") or []), *train_over]
    if output_dir:
        raw["output_dir"] = output_dir
    try:
        return AblationSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, str(path))) from None


def base_config(spec: AblationSpec) -> Config:
    """The training config every variant derives from (``output_dir`` = the ablation root)."""
    first = LAST_POLICY if spec.policy == "last" else ()
    return resolve(load_config(preset_path(spec.base), [*first, *spec.overrides, f"output_dir={spec.output_dir}"]))


def plan(spec: AblationSpec, cfg: Config) -> list[Job]:
    """Every run, RL variants first (the long ones start first)."""
    jobs = plan_jobs(cfg, spec.output_dir, spec.variants, spec.seeds, spec.group_size, spec.curve)
    return sorted(jobs, key=lambda j: j.kind != "rl")


def spec_params(spec: AblationSpec) -> dict:
    """The spec as flat MLflow params of the parent run (``ablation.seeds``...); the training
    overrides are in the logged config itself."""
    return {f"ablation.{k}": v for k, v in flatten(spec).items() if k != "overrides"}


# ----------------------------------------------------------------------------- task runner


WORKER_STOP_GRACE_S = 10.0
"""Seconds a worker gets to end its runs after SIGTERM before it is killed (:func:`stop_workers`)."""


def stop_workers(runs: list | None = None, grace_s: float = WORKER_STOP_GRACE_S) -> int:
    """Stop this process's multiprocessing children (the process runner's workers, a local Dask
    cluster's) now: SIGTERM, which unwinds each one's run (ended KILLED) in about a second; once
    the ``runs`` in progress (their Prefect futures) have reported that, or ``grace_s`` has passed,
    SIGKILL to the workers still there. A stopped ablation must not wait minutes for the runs in
    progress (Prefect's runners cancel only the jobs not yet started, and its process pool joins
    the running ones), nor for the workers' own exit (a worker that imported torch and vLLM took
    6-8 s to tear its interpreter down on a busy machine). A stopped run resumes from its
    checkpoint, and an MLflow run a kill left RUNNING is ended KILLED by the next start.
    Returns how many there were."""
    import multiprocessing

    from prefect.futures import wait

    children = multiprocessing.active_children()
    for p in children:
        p.terminate()
    if runs and children:  # (a thread runner's runs are no process's: nothing here would stop them)
        wait(runs, timeout=grace_s)
    deadline = time.monotonic() + (0 if runs else grace_s)
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(grace_s)
    if children:
        log.warning("stopped %d worker process(es) of the ablation", len(children))
    return len(children)


def task_runner(settings: RunnerSettings):
    """The Prefect task runner of ``settings.kind`` (prefect-dask imported only here)."""
    from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

    workers, _ = settings.resolved()
    if settings.kind == "process":
        return ProcessPoolTaskRunner(max_workers=workers)
    if settings.kind == "sequential":
        # One run at a time: runs share process-wide state (torch threads, Accelerate).
        return ThreadPoolTaskRunner(max_workers=1)
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:
        raise ConfigError("runner.kind 'dask' needs the prefect-dask package (pip install -e '.[dask]'); "
                          "or use runner.kind=process") from exc
    if settings.address:
        return DaskTaskRunner(address=settings.address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})


@contextmanager
def workers_share_api() -> Iterator[None]:
    """Let worker processes report to this flow run's Prefect API.

    Without ``PREFECT_API_URL`` Prefect serves a temporary API from this process, and every
    spawned worker would start its own (on the same SQLite database, which fails): the workers
    are handed this one's URL instead.
    """
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ctx = FlowRunContext.get()
    if PREFECT_API_URL.value() or ctx is None:
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: str(ctx.client.api_url)}):
        yield


# ----------------------------------------------------------------------------- tasks


@task(name="ablation-warm-up", cache_policy=NO_CACHE)
def shared_warmup(cfg: Config, spec: AblationSpec, run_id: str | None = None) -> str:
    """The warm-up every variant starts from: ``<root>/warmup``, trained once (or linked to
    ``spec.warmup``). A root made with another base config or warm-up is refused."""
    root = Path(spec.output_dir)
    splits = workspace(cfg).splits
    if spec.curve.split not in splits:  # found now, not in every run
        raise ConfigError(f"{cfg.data.dir}: curve.split {spec.curve.split!r} is not a split; available: {sorted(splits)}")
    given = str(Path(spec.warmup).resolve()) if spec.warmup else None
    claim_run_dir(root)
    claim(root / ROOT_FILE, {"base_config_hash": config_hash(cfg), "warmup": given})
    target = root / WARMUP_DIR
    if given:
        if not (Path(given) / "config.json").is_file():
            raise FileNotFoundError(f"warmup={spec.warmup}: not a policy directory (no config.json)")
        if not target.is_symlink() and not target.exists():
            target.symlink_to(given, target_is_directory=True)
        return str(target)
    if finished_warmup(cfg) is None:
        if spec.runner.warmup_threads:
            pin_threads(spec.runner.warmup_threads)
    return warm_up.fn(cfg, run_id)


def run_tags(job: Job) -> dict[str, str]:
    """Tags of a (variant, seed) run; the switches are "n/a" for the baselines (no training)."""
    p, r, rl = job.cfg.ppo, job.cfg.reward, job.kind == "rl"
    switches = {"estimator": p.estimator, "loss_mask": p.loss_mask, "advantage_mask": p.advantage_mask,
                "process_reward": r.process_enabled}
    return {"ablation.variant": job.variant, "ablation.seed": str(job.seed), "ablation.kind": job.kind,
            **{f"ablation.{k}": str(v) if rl else "n/a" for k, v in switches.items()},
            tracking.TAG_CONFIG_HASH: config_hash(job.cfg)}


@task(name="ablation-run", task_run_name="{job.variant}-seed{job.seed}", cache_policy=NO_CACHE)
def ablation_run(job: Job, warmup_dir: str, parent_run_id: str | None = None, threads: int | None = None) -> dict:
    """One (variant, seed) run as an MLflow run nested under ``parent_run_id``: trained (or
    resumed from its checkpoint, or taken as it is when finished), its learning curve as
    ``curve/<metric>`` (step = iteration), its final evaluation as ``final/<metric>``."""
    import multiprocessing

    if threads:
        pin_threads(threads)
    try:
        with lifecycle.start_run(tracking.EXPERIMENTS["ablation"], f"{job.variant}/seed-{job.seed}",
                                tags=run_tags(job), parent_run_id=parent_run_id) as run_id:
            tracking.log_config(run_id, job.cfg)
            live: set[int] = set()
            sink = metrics_logger(run_id)

            def log_live(metrics: dict[str, float], step: int) -> None:
                sink(metrics, step)
                live.add(step)

            result = run_job(job, workspace(job.cfg), warmup_dir, log_metrics=log_live)
            log_run_files(run_id, job, result, live)
    except BaseException as exc:
        stop = errors.interruption(exc)
        if stop is None or multiprocessing.parent_process() is None:
            raise
        raise RunInterrupted(f"{job.variant}/seed-{job.seed}: stopped by {type(stop).__name__} (its MLflow run "
                             "ended KILLED; the same command resumes it from its checkpoint)") from exc
    return {**result, "run_id": run_id}


class RunInterrupted(RuntimeError):
    """A run in a worker process stopped by SIGTERM or Ctrl-C. Sent back to the flow as an
    ordinary error: the SystemExit or KeyboardInterrupt itself, re-raised in the process pool's
    result thread by Prefect's done-callback, ended that thread, so the pool never told its
    workers to leave and the stop waited for them to be killed (16-18 s for a tiny ablation)."""


def log_run_files(run_id: str, job: Job, result: dict, live: set[int]) -> None:
    """What a run left on disk, into its MLflow run: the iterations not logged live (earlier
    attempts, or all of a finished run), the curve, the final metrics, the evaluation files."""
    for step, metrics in enumerate(read_jsonl(job.run_dir / HISTORY_FILE), start=1):
        if step not in live:
            tracking.log_metrics(run_id, metrics, step=step)
    for point in result["curve"]:
        values = {k: point[k] for k in (*CURVE_KEYS, "train_seconds")}
        tracking.log_metrics(run_id, values, step=int(point["iteration"]), prefix="curve/")
    tracking.log_metrics(run_id, result["final"], step=result["iterations"], prefix="final/")
    tracking.set_tags(run_id, {"ablation.status": result["status"]})
    files = [job.run_dir / f for f in ("curve.jsonl", f"eval_{FINAL_TAG}.json", f"trajectories_{FINAL_TAG}.txt")]
    tracking.log_artifacts(run_id, *[f for f in files if f.exists()], artifact_path="run")


# ----------------------------------------------------------------------------- report


def write_report(spec: AblationSpec, cfg: Config, results: list[dict], failures: list[dict], wall_s: float,
                 command: str) -> tuple[str, Efficiency, dict[str, Path]]:
    """results.md (table, efficiency, figure), results.csv, curves.csv, curves.png and
    efficiency.json in the ablation root; returns (markdown, efficiency, paths)."""
    from agentr1.plots import plot_ablation_curves

    root = Path(spec.output_dir)
    rows = summarize(results)
    curves = curves_by_variant(results)
    rl = {n: c for n, c in curves.items() if VARIANTS[n].kind == "rl"}
    baselines = {n: c[0] for n, c in curves.items() if VARIANTS[n].kind != "rl"}
    eff = efficiency(rl, spec.curve.metric)
    against = efficiency_table(rl, spec.curve.metric)
    paths = {name: root / name for name in (*REPORT_FILES, PLOT_FILE)}
    plot_ablation_curves(rl, paths[PLOT_FILE], baselines, split=spec.curve.split,
                         title=f"ablation `{spec.output_dir}`: held-out exact match (mean ± std over seeds)")
    text = report_markdown(spec, cfg, results, failures, rows, eff, wall_s, command, paths[PLOT_FILE], against)
    write_text(paths["results.md"], text)
    write_text(paths["results.csv"], results_csv(rows))
    write_text(paths["curves.csv"], curves_csv(results))
    write_json(paths["efficiency.json"], {**eff.to_dict(), "against": [e.to_dict() for e in against]})
    return text, eff, paths


def report_markdown(spec: AblationSpec, cfg: Config, results: list[dict], failures: list[dict], rows, eff: Efficiency,
                    wall_s: float, command: str, plot: Path, against: list[Efficiency] | None = None) -> str:
    """What ``results.md`` says: how it was made, the table, the efficiency (against vanilla
    PPO, then against every variant), the figure."""
    n_final = int(results[0]["final"].get("greedy/n", 0)) if results else 0
    reused = sum(r["status"] == "reused" for r in results)
    trained = [r["train_seconds"] for r in results if r["kind"] == "rl"]
    every = spec.curve.every or cfg.ppo.iterations
    setup = (f"Every RL variant: the same warm-up `{Path(spec.output_dir) / WARMUP_DIR}`, {cfg.ppo.iterations} PPO "
             f"iterations x {cfg.ppo.episodes_per_iter} episodes (GRPO/RLOO: {spec.group_size} answers per "
             f"question), seeds {spec.seeds}; data `{cfg.data.dir}`; final evaluation on `{cfg.eval.split}` "
             f"({n_final} questions), greedy and sampled; learning curves on the first "
             f"{spec.curve.max_examples or 'all'} `{spec.curve.split}` questions every {every} iterations.")
    made = (f"Command: `{command}`; wall time {wall_s / 60:.1f} min for {len(results)} runs "
            f"({reused} of them finished by an earlier attempt and reused).")
    lines = [made, setup]
    if trained:
        lines.append(f"Training time per RL run: {sum(trained) / len(trained):.0f} s on average (rollouts + "
                     f"updates; {spec.runner.kind} runner on {os.cpu_count()} cores, so runs shared them).")
    speed = f"**Learning efficiency** (`{FULL}` vs `{VANILLA}`, {eff.metric} on {spec.curve.split}): {eff.sentence()}"
    lines += ["", results_markdown(rows, cfg.eval.split), "", speed, ""]
    if against:
        lines += [f"The same figure against every variant: the first curve point (every {every} iterations) at "
                  f"which the full method's mean curve reaches the variant's final mean, against the variant's own "
                  f"first point there (ratios below 1: the full method is faster).", "",
                  efficiency_markdown(against, spec.curve.split), ""]
    lines += [f"![learning curves]({plot})", ""]
    if failures:
        lines += ["**Failed runs** (re-run with the same output dir to resume them):", "",
                  *(f"- `{f['variant']}` seed {f['seed']}: {f['error']}" for f in failures), ""]
    return "\n".join(lines)


def publish_report(run_id: str, paths: dict[str, Path], eff: Efficiency, results: list[dict]) -> None:
    """The report files and plot as artifacts of the parent run, and its headline metrics."""
    tracking.log_artifacts(run_id, *[paths[f] for f in REPORT_FILES], artifact_path="results")
    tracking.log_plot(run_id, paths[PLOT_FILE])
    means: dict[str, float] = {}
    for row in summarize(results):
        for k, (mean, _) in row.stats.items():
            means[f"{row.variant}/{k}"] = mean
    if eff.iteration_ratio is not None:
        means["efficiency/iteration_ratio"] = eff.iteration_ratio
    if eff.time_ratio is not None:
        means["efficiency/time_ratio"] = eff.time_ratio
    tracking.log_metrics(run_id, means, step=0, prefix="final/")
