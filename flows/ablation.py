"""The ablation flow: the paper's mask, reward and estimator experiments, from one warm-up.

    data -> validate -> one warm-up -> every (variant, seed) run in parallel through the
    preset's task runner (each a nested MLflow run, each resumable) -> table, learning
    curves, efficiency ratio

One parent MLflow run per flow run (experiment ``agentr1-ablation``) with a nested run per
(variant, seed); the report (``results.md``, ``results.csv``, ``curves.csv``, ``curves.png``,
``efficiency.json``) lands in the ablation root, in MLflow and as the Prefect markdown
artifact ``ablation-summary``. Re-running with the same output dir skips finished runs and
resumes unfinished ones from their checkpoints; a root made with another config is refused.

    agentr1 ablate --preset quick [-o seeds=[0,1,2] -o ppo.iterations=10 ...]
    make serve   # then Run on deployment "ablation/mask-and-reward" in the Prefect UI
"""
from __future__ import annotations

import logging
import shlex
import time

from prefect import flow
from prefect.futures import wait

from agentr1 import errors
from agentr1.ablation import Job
from agentr1.rundir import weights_digest
from flows.pipeline import run_name
from flows.pipeline import run_tags as flow_tags
from adapters import lifecycle, tracking
from flows.forms import AblationParams
from tasks.ablation import (
    ablation_run,
    base_config,
    load_spec,
    plan,
    publish_report,
    shared_warmup,
    spec_params,
    stop_workers,
    task_runner,
    workers_share_api,
    write_report,
)
from tasks.data import prepare_data, validate_data
from adapters.report import publish_summary

ERROR_CHARS = 400
PROGRESS_S = 30.0
log = logging.getLogger("agentr1.flows.ablation")


class AblationFailed(RuntimeError):
    """Some runs failed; the report of the others was published, a re-run resumes them."""


@flow(name="ablation-runs", description="Every (variant, seed) run of an ablation, through the chosen task runner.")
def run_all(jobs: list[Job], warmup_dir: str, parent_run_id: str, threads: int) -> tuple[list[dict], list[dict]]:
    """Submit every run, wait for all; returns (results, failures) so one failed run does not
    hide the others."""
    futures = [(job, ablation_run.submit(job, warmup_dir, parent_run_id, threads)) for job in jobs]
    results, failures = [], []
    try:
        t0, pending = time.monotonic(), [f for _, f in futures]
        while pending:  # a line every PROGRESS_S: the workers' own logs stay in their processes
            pending = list(wait(pending, timeout=PROGRESS_S).not_done)
            if pending:
                log.info("ablation: %d of %d runs finished, %.1f min", len(jobs) - len(pending), len(jobs),
                         (time.monotonic() - t0) / 60)
        for job, future in futures:
            try:
                results.append(future.result())
            except Exception as exc:  # noqa: BLE001 - reported with the run it belongs to
                failures.append({"variant": job.variant, "seed": job.seed, "error": repr(exc)[:ERROR_CHARS]})
    except BaseException as exc:
        if errors.interruption(exc) is not None:  # SIGTERM, Ctrl-C: not after the running jobs end
            stop_workers([f for _, f in futures])
        raise
    return results, failures


def command_line(params: AblationParams, command: str = "ablate") -> str:
    """The ``agentr1`` command that runs (or resumes) the flow of ``params`` (the ablation's, the suite's)."""
    words = ["agentr1", command, "--preset", params.preset]
    for o in params.overrides:
        words += ["-o", o]
    if params.output_dir:
        words += ["--output-dir", params.output_dir]
    return shlex.join(words)


@flow(name="ablation", description="Mask / reward / estimator ablation from one warm-up: table, curves, efficiency.")
def ablation(params: AblationParams = AblationParams()) -> dict:
    """Run (or resume) every variant of the preset and publish the table and plots."""
    t0 = time.time()
    spec = load_spec(params.preset, params.overrides, params.output_dir)
    cfg = base_config(spec)
    jobs = plan(spec, cfg)
    runner = task_runner(spec.runner)  # fails now, not after the warm-up, if prefect-dask is missing
    _, threads = spec.runner.resolved()
    tags = {**flow_tags(), "ablation.preset": params.preset, "ablation.root": spec.output_dir,
            tracking.TAG_STUDY: spec.study}
    with lifecycle.start_run(tracking.EXPERIMENTS["ablation"], run_name("ablation"), tags=tags) as run_id:
        tracking.log_config(run_id, cfg)
        tracking.log_params(run_id, spec_params(spec))
        data = prepare_data(cfg, spec.source, run_id)
        validate_data(data)
        warm = shared_warmup(cfg, spec, run_id)
        # The warm-up is a factor of the result: its digest is what the report groups runs by, its
        # weights (a few MB) an artifact, so a table can be re-derived from MLflow alone.
        tracking.set_tags(run_id, {tracking.TAG_WARMUP_DIGEST: weights_digest(warm)})
        tracking.log_artifacts(run_id, warm)
        with workers_share_api():
            results, failures = run_all.with_options(task_runner=runner)(jobs, warm, run_id, threads)
        text, eff, paths = write_report(spec, cfg, results, failures, time.time() - t0, command_line(params))
        publish_report(run_id, paths, eff, results)
        publish_summary("ablation-summary", f"ablation: {params.preset} ({spec.output_dir})", [text], run_id)
        if failures:
            raise AblationFailed(f"{len(failures)} of {len(jobs)} runs failed (see {paths['results.md']}); "
                                 f"re-run with output_dir={spec.output_dir} to resume them")
    return {"run_id": run_id, "output_dir": spec.output_dir, "results_md": str(paths["results.md"]),
            "plot": str(paths["curves.png"]), "efficiency": eff.to_dict(), "wall_seconds": time.time() - t0,
            "runs": [{k: r[k] for k in ("variant", "seed", "kind", "status", "run_id", "final", "train_seconds")}
                     for r in results]}
