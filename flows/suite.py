"""The task suite flow: the default recipe on every task of a suite, and one table.

    for each task: its ablation flow (data -> validate -> warm-up -> the warm-up evaluated and
    the recipe's PPO runs, one per seed) -> the suite table (warm-up and final test EM, greedy
    and sampled, mean ± std over seeds, and the gain) -> results.md, results.csv, suite.json

One parent MLflow run per flow run (experiment ``agentr1-ablation``, tagged with the suite's
study); each task's ablation parent run is nested under it, its (variant, seed) runs under that.
A task that fails does not stop the others; the flow then fails after the report, and running
it again with the same output dir reuses the finished runs and resumes the rest.

    agentr1 suite [--preset default] [-o seeds=[0,1,2] -o ppo.iterations=10 ...]
    make serve   # then Run on deployment "suite/default" in the Prefect UI
"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow

from agentr1.metrics import EM_KEYS
from agentr1.fsutil import write_json, write_text
from agentr1.rundir import SUITE_REPORT, claim_run_dir
from agentr1.suite import TaskRow, mean_gain, suite_csv, suite_markdown, task_row
from flows.ablation import ERROR_CHARS, ablation, command_line
from flows.pipeline import run_name
from flows.pipeline import run_tags as flow_tags
from adapters import lifecycle, tracking
from adapters.report import publish_summary
from flows.forms import AblationParams, SuiteParams, SuiteSpec, load_suite, write_task_spec


class SuiteFailed(RuntimeError):
    """Some tasks failed; the table of the others was published, a re-run resumes them."""


def write_suite_report(spec: SuiteSpec, rows: list[TaskRow], failures: list[dict], header: list[str]
                       ) -> tuple[str, dict[str, Path]]:
    """results.md (how it was made, the table, failures), results.csv and suite.json in the root."""
    root = Path(spec.output_dir)
    paths = {name: root / name for name in SUITE_REPORT}
    lines = [*header, "", suite_markdown(rows)]
    if failures:
        lines += ["", "**Failed tasks** (re-run with the same output dir to resume them):", ""]
        lines += [f"- `{f['task']}`: {f['error']}" for f in failures]
    text = "\n".join(lines) + "\n"
    write_text(paths["results.md"], text)
    write_text(paths["results.csv"], suite_csv(rows))
    write_json(paths["suite.json"], {"spec": spec.model_dump(mode="json"), "failures": failures,
                                     "rows": [r.__dict__ for r in rows]})
    return text, paths


@flow(name="suite", description="The default recipe on every task of a suite: warm-up and final EM, and the gain.")
def suite(params: SuiteParams = SuiteParams()) -> dict:
    """Run (or resume) every task of the preset and publish the suite table."""
    t0 = time.time()
    spec = load_suite(params)
    claim_run_dir(spec.output_dir)  # the task presets and the suite's tables go there: ours, or refused
    tags = {**flow_tags(), tracking.TAG_SUITE_PRESET: params.preset, "suite.root": spec.output_dir,
            tracking.TAG_STUDY: spec.study}
    with lifecycle.start_run(tracking.EXPERIMENTS["ablation"], run_name("suite"), tags=tags) as run_id:
        tracking.log_params(run_id, {"suite.tasks": ",".join(spec.tasks), "suite.seeds": str(spec.seeds),
                                     "suite.overrides": " ".join(spec.overrides)})
        rows, failures, task_runs = [], [], {}
        for name in spec.tasks:
            preset = write_task_spec(spec, name)
            try:
                out = ablation.with_options(flow_run_name=f"suite-{name}")(AblationParams(preset=str(preset)))
                tracking.nest_run(out["run_id"], run_id, {tracking.TAG_SUITE_TASK: name})
                rows.append(task_row(name, out["runs"]))
                task_runs[name] = out["run_id"]
            except Exception as exc:  # noqa: BLE001 - reported with its task; the others go on
                failures.append({"task": name, "error": repr(exc)[:ERROR_CHARS]})
        for r in rows:
            tracking.log_metrics(run_id, {f"{r.task}/{w}/{m}": getattr(r, w)[m][0] for w in ("warmup", "final", "gain")
                                          for m in EM_KEYS}, step=0)
        tracking.log_metrics(run_id, {f"mean_gain/{m}": mean_gain(rows, m) for m in EM_KEYS}, step=0)
        header = [f"Command: `{command_line(params, 'suite')}`; wall time {(time.time() - t0) / 60:.1f} min for "
                  f"{len(spec.tasks)} tasks x seeds {spec.seeds}.",
                  "Each task: its warm-up evaluated (`warm-up`) and the recipe's PPO from it (`final`), on the "
                  "task's test split; mean ± std over the PPO seeds (one warm-up per task). Task ablations "
                  f"(MLflow parent runs): {', '.join(f'`{t}` {r}' for t, r in task_runs.items()) or 'none'}."]
        text, paths = write_suite_report(spec, rows, failures, header)
        tracking.log_artifacts(run_id, *paths.values())
        publish_summary("suite-summary", f"suite: {params.preset} ({spec.output_dir})", [text], run_id)
        if failures:
            raise SuiteFailed(f"{len(failures)} of {len(spec.tasks)} tasks failed (see {paths['results.md']}); "
                              f"re-run with output_dir={spec.output_dir} to resume them")
    return {"run_id": run_id, "output_dir": spec.output_dir, "results_md": str(paths["results.md"]),
            "tasks": task_runs, "mean_gain": {m: mean_gain(rows, m) for m in EM_KEYS},
            "wall_seconds": time.time() - t0}
