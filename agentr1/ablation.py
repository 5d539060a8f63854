"""The paper's ablations: which variants, how one (variant, seed) run is trained and scored,
and how the seeds are summed up (table, learning curves, learning-efficiency ratio).

Every variant starts from the same warm-up checkpoint with the same budget (PPO iterations x
episodes per iteration); they differ only in the switches the paper ablates (loss mask,
advantage mask, process rewards, advantage estimator). Two baselines train nothing: the
warm-up policy as it is ("base tool call") and naive RAG (one search with the question as
the query, forced; then the warm-up policy writes the answer).

No Prefect or MLflow here (``tasks/ablation.py`` and ``flows/ablation.py`` wrap this).

Run layout under the ablation's output directory::

    warmup/                       the one warm-up checkpoint (or a link to a given one)
    runs/<variant>/seed-<s>/      one (variant, seed) run; ``warmup`` links to ../../../warmup
        job.json                  what the run was started with (guards resuming)
        checkpoints/last/         the PPOSession checkpoint (where an unfinished run resumes)
        curve.jsonl               held-out EM / F1 at the evaluation iterations
        metrics.jsonl             training metrics per PPO iteration
        eval_final.json, trajectories_final.txt   on ``eval.split`` (the table's numbers)
        result.json               written last: the run is finished (a re-run skips it)
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentr1.config import Config, ConfigError, Estimator, _format_validation_error, apply_overrides, config_hash
from agentr1.fsutil import write_json
from agentr1.metrics import CURVE_KEYS
from agentr1.rundir import CURVE_POINTS_FILE, JOB_FILE, RESULT_FILE, claim

Kind = Literal["rl", "base", "naive_rag"]
MetricsFn = Callable[[dict[str, float], int], None]

RUNS_DIR = "runs"
WARMUP_DIR = "warmup"
FINAL_TAG = "final"
# Evaluation seeds sit apart from the training seeds of the same run.
CURVE_SEED_OFFSET = 54_321
# A mean curve "reaches" a target within this (means of a few 0/1 scores are not exact).
REACH_EPS = 1e-9


# ----------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    """One row of the ablation table."""

    name: str
    """Directory and MLflow run name."""
    label: str
    kind: Kind
    overrides: tuple[str, ...] = ()
    """Config switches; every RL variant sets all six so the base preset cannot leak in."""
    grouped: bool = False
    """Samples ``group_size`` answers per question (GRPO, RLOO); the others one."""


def _rl(estimator: Estimator = "gae", *, loss_mask: bool = True, advantage_mask: bool = True,
        process: bool = True, weighting: str = "token", window: int | None = None) -> tuple[str, ...]:
    """The overrides of an RL variant: the full method unless a switch says otherwise."""
    flag = {True: "true", False: "false"}
    return (f"ppo.estimator={estimator}", f"ppo.loss_mask={flag[loss_mask]}",
            f"ppo.advantage_mask={flag[advantage_mask]}", f"reward.process_enabled={flag[process]}",
            f"ppo.loss_weighting={weighting}", f"ppo.minibatch_window={window or 'null'}")


FULL = "ppo"
VANILLA = "ppo-vanilla"
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant(FULL, "PPO, both masks + process rewards (full)", "rl", _rl()),
    Variant("ppo-no-adv-mask", "PPO, no advantage mask", "rl", _rl(advantage_mask=False)),
    Variant("ppo-no-masks", "PPO, no masks", "rl", _rl(loss_mask=False, advantage_mask=False)),
    Variant("ppo-outcome-only", "PPO, outcome reward only", "rl", _rl(process=False)),
    Variant("ppo-step-gae", "PPO, step-level GAE (each turn one step)", "rl", _rl("step_gae")),
    Variant("ppo-traj-weight", "PPO, every episode weighs the same in the loss", "rl", _rl(weighting="trajectory")),
    Variant("ppo-mb-window", "PPO, minibatches shuffled in windows of 2", "rl", _rl(window=2)),
    Variant(VANILLA, "PPO, no masks + outcome only (vanilla)", "rl", _rl(loss_mask=False, advantage_mask=False, process=False)),
    Variant("grpo", "GRPO, loss mask", "rl", _rl("grpo"), grouped=True),
    Variant("grpo-no-loss-mask", "GRPO, no loss mask", "rl", _rl("grpo", loss_mask=False), grouped=True),
    Variant("gigpo", "GiGPO (GRPO + turn-level credit)", "rl", _rl("gigpo"), grouped=True),
    Variant("reinforce-pp", "REINFORCE++", "rl", _rl("reinforce_pp")),
    Variant("rloo", "RLOO", "rl", _rl("rloo"), grouped=True),
    Variant("base-tool-call", "base tool call (warm-up, no RL)", "base"),
    Variant("naive-rag", "naive RAG (search the question once, answer)", "naive_rag"),
)}


class CurveSettings(BaseModel):
    """When and on what the learning curves are measured (greedy and sampled)."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(2, ge=0)
    """Evaluate every N PPO iterations; iteration 0 (the warm-up) and the last are always in.
    0: only those two."""
    split: str = "dev"
    max_examples: int | None = Field(32, ge=1)
    """The first N questions of ``split`` (None: all)."""
    metric: str = "greedy/em"
    """The curve metric the efficiency ratio compares."""


@dataclass(frozen=True)
class Job:
    """One (variant, seed) run: its resolved config (``output_dir`` is the run directory)."""

    variant: str
    seed: int
    cfg: Config
    curve: CurveSettings

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def kind(self) -> Kind:
        return VARIANTS[self.variant].kind

    def identity(self) -> dict:
        """What must not change between attempts of this run (checked when resuming)."""
        return {"variant": self.variant, "seed": self.seed, "config_hash": config_hash(self.cfg),
                "curve": self.curve.model_dump()}


def derive(cfg: Config, overrides: list[str]) -> Config:
    """``cfg`` with dotted ``key=value`` overrides applied, validated again."""
    try:
        return Config.model_validate(apply_overrides(cfg.model_dump(mode="json"), overrides))
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, f"overrides {overrides}")) from None


def run_dir(root: str | Path, variant: str, seed: int) -> Path:
    return Path(root) / RUNS_DIR / variant / f"seed-{seed}"


def variant_overrides(variant: Variant, group_size: int) -> list[str]:
    group = f"ppo.group_size={group_size if variant.grouped else 1}"
    return [*variant.overrides, group] if variant.kind == "rl" else list(variant.overrides)


def plan_jobs(base: Config, root: str | Path, variants: list[str], seeds: list[int], group_size: int,
              curve: CurveSettings) -> list[Job]:
    """Every (variant, seed) run; unknown variant names fail with the known ones listed."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown ablation variant(s) {unknown}; choose from {list(VARIANTS)}")
    jobs = []
    for name in variants:
        for seed in seeds:
            overrides = [*variant_overrides(VARIANTS[name], group_size), f"seed={seed}",
                         f"output_dir={run_dir(root, name, seed)}"]
            jobs.append(Job(name, seed, derive(base, overrides), curve))
    return jobs


# ----------------------------------------------------------------------------- run directories


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def link_warmup(run: Path, warmup_dir: Path) -> None:
    """``run/warmup`` -> the shared warm-up (a relative link, so the tree can move)."""
    link = run / WARMUP_DIR
    if link.is_symlink() or link.exists():
        return
    link.symlink_to(os.path.relpath(warmup_dir.resolve(), run.resolve()), target_is_directory=True)


def finished(job: Job) -> dict | None:
    """The result of a finished run, None when it has not finished."""
    path = job.run_dir / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else None


# ----------------------------------------------------------------------------- one run


def curve_records(ws, curve: CurveSettings) -> list:
    if curve.split not in ws.splits:
        raise ConfigError(f"{ws.data_dir}: curve.split {curve.split!r} is not a split; "
                          f"available: {sorted(ws.splits)}")
    records = ws.splits[curve.split]
    return records[: curve.max_examples] if curve.max_examples else records


def eval_iterations(total: int, every: int) -> set[int]:
    """Iterations at which the learning curve is measured: 0, every ``every``, and the last."""
    marks = {0, total}
    if every:
        marks.update(range(every, total, every))
    return marks


def curve_point(engine, records: list, cfg: Config, iteration: int, train_seconds: float) -> dict:
    """Greedy and sampled held-out metrics of the engine's policy, at an iteration."""
    from agentr1.evaluate import evaluate

    temp = cfg.eval.sampled_temperature or cfg.rollout.temperature
    result = evaluate(engine, records, seed=cfg.seed + CURVE_SEED_OFFSET, sampled_temperature=temp,
                      batch_size=cfg.eval.batch_size)
    return {"iteration": iteration, "train_seconds": train_seconds,
            **{k: result.metrics[k] for k in CURVE_KEYS}}


def train_seconds(history: list[dict]) -> float:
    """Seconds spent in rollouts and updates (evaluations left out), over all attempts."""
    return float(sum(h["perf/iter_s"] for h in history))


def train_rl(job: Job, ws, log_metrics: MetricsFn | None = None, stop_after: int | None = None
             ) -> tuple[list[dict], list[dict], object | None]:
    """PPO iterations of ``job`` (:func:`agentr1.recipe.ppo.run_ppo`, from its checkpoint or the
    warm-up), measuring the learning curve at :func:`eval_iterations`, checkpointed there first.
    Returns ``(curve, history, session)``; the session is None when ``stop_after`` (iterations
    in total, for tests) ended the run early."""
    from agentr1.recipe.outputs import write_history
    from agentr1.recipe.ppo import PPOSession, run_ppo

    cfg = job.cfg
    session = PPOSession(cfg, ws)
    marks = eval_iterations(cfg.ppo.iterations, job.curve.every)
    records = curve_records(ws, job.curve)
    path = job.run_dir / CURVE_POINTS_FILE
    curve = [p for p in read_jsonl(path) if p["iteration"] <= session.iteration]

    def measure(s) -> None:
        if s.iteration not in marks or (curve and curve[-1]["iteration"] == s.iteration):
            return
        s.model.eval()
        s.engine.backend.sync_weights(s.policy.policy)  # a vllm backend holds a copy
        curve.append(curve_point(s.engine, records, cfg, s.iteration, train_seconds(s.history)))
        write_json(path, curve)

    measure(session)  # iteration 0, or a crash between a checkpoint and its curve point
    run_ppo(session, stop_after, log_metrics, save_at=frozenset(marks), after_iteration=measure)
    write_history(cfg, session.history)  # cfg.output_dir is the run directory
    return curve, session.history, (session if session.done else None)


def run_job(job: Job, ws, warmup_dir: str | Path, log_metrics: MetricsFn | None = None,
            stop_after: int | None = None) -> dict | None:
    """Train (RL variants) and evaluate one run; returns its result (also ``result.json``).

    A finished run is returned as it is; an unfinished RL run resumes from its checkpoint.
    Returns None when ``stop_after`` stopped training before the end (tests).
    """
    from agentr1.recipe.evaluation import naive_rag_engine, run_eval
    from agentr1.recipe.outputs import selected_policy
    from agentr1.recipe.workspace import load_policy

    claim(job.run_dir / JOB_FILE, job.identity())
    done = finished(job)
    if done is not None:
        return {**done, "status": "reused"}
    link_warmup(job.run_dir, Path(warmup_dir))
    cfg = job.cfg
    resumed = (job.run_dir / "checkpoints" / "last").exists()
    history: list[dict] = []
    if job.kind == "rl":
        curve, history, session = train_rl(job, ws, log_metrics, stop_after)
        if session is None:
            return None
        # the run's result is the policy `agentr1 train` would make final/: the best on dev, or the last
        policy = load_policy(ws, selected_policy(cfg)[0]) if cfg.ppo.dev_every else \
            (session.policy, session.tokenizer, session.chat)
        engine = None
    else:
        policy = load_policy(ws, job.run_dir / WARMUP_DIR)
        records = curve_records(ws, job.curve)
        if job.kind == "naive_rag":
            engine = naive_rag_engine(cfg, ws, *policy, [*records, *ws.splits[cfg.eval.split]])
        else:
            from agentr1.recipe.workspace import make_engine

            engine = make_engine(cfg, ws.env, *policy, ws.device)
        curve = [curve_point(engine, records, cfg, 0, 0.0)]
        write_json(job.run_dir / CURVE_POINTS_FILE, curve)
    metrics = run_eval(cfg, ws, *policy, FINAL_TAG, engine=engine).metrics
    result = {"variant": job.variant, "seed": job.seed, "kind": job.kind, "split": cfg.eval.split,
              "status": "resumed" if resumed else "trained",
              "iterations": len(history), "train_seconds": train_seconds(history), "curve": curve,
              "final": {k: v for k, v in metrics.items() if k.count("/") == 1}, "config_hash": config_hash(cfg)}
    write_json(job.run_dir / RESULT_FILE, result)
    return result


# ----------------------------------------------------------------------------- seeds summed up


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation; the deviation is NaN for fewer than two values."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


@dataclass(frozen=True)
class Row:
    """A variant's final metrics (on ``eval.split``) over its seeds."""

    variant: str
    label: str
    kind: str
    seeds: int
    stats: dict[str, tuple[float, float]]
    """metric -> (mean, std) over seeds."""
    train_seconds: float


def summarize(results: list[dict], keys: tuple[str, ...] = CURVE_KEYS) -> list[Row]:
    """One row per variant (in :data:`VARIANTS` order) of final ``keys``, mean and std over seeds."""
    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
    rows = []
    for name in sorted(by_variant, key=lambda n: list(VARIANTS).index(n) if n in VARIANTS else len(VARIANTS)):
        runs = by_variant[name]
        v = VARIANTS.get(name)
        rows.append(Row(name, v.label if v else name, runs[0]["kind"], len(runs),
                        {k: mean_std([r["final"][k] for r in runs]) for k in keys},
                        statistics.fmean(r["train_seconds"] for r in runs)))
    return rows


def _pm(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.3f}" if math.isnan(std) else f"{mean:.3f} ± {std:.3f}"


def results_markdown(rows: list[Row], split: str = "test", keys: tuple[str, ...] = CURVE_KEYS) -> str:
    """The table: one row per variant, ``mean ± std`` over seeds of each metric on ``split``."""
    header = ["variant", "seeds", *(f"{split} {k}" for k in keys), "train s/run"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for r in rows:
        cells = [f"{r.label} (`{r.variant}`)", str(r.seeds), *(_pm(*r.stats[k]) for k in keys),
                 f"{r.train_seconds:.0f}" if r.kind == "rl" else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def results_csv(rows: list[Row], keys: tuple[str, ...] = CURVE_KEYS) -> str:
    head = ["variant", "label", "kind", "seeds", *(f"{k}_{s}" for k in keys for s in ("mean", "std")),
            "train_seconds"]
    return _csv(head, [[r.variant, r.label, r.kind, r.seeds, *(x for k in keys for x in r.stats[k]), r.train_seconds]
                       for r in rows])


def mean_curve(results: list[dict], keys: tuple[str, ...] = CURVE_KEYS) -> list[dict]:
    """The seeds' curves averaged per iteration: ``{iteration, train_seconds, k, k/std}``."""
    by_iter: dict[int, list[dict]] = {}
    for r in results:
        for p in r["curve"]:
            by_iter.setdefault(int(p["iteration"]), []).append(p)
    out = []
    for it in sorted(by_iter):
        points = by_iter[it]
        row = {"iteration": it, "train_seconds": statistics.fmean(p["train_seconds"] for p in points),
               "seeds": len(points)}
        for k in keys:
            row[k], row[f"{k}/std"] = mean_std([p[k] for p in points])
        out.append(row)
    return out


def curves_by_variant(results: list[dict]) -> dict[str, list[dict]]:
    names = sorted({r["variant"] for r in results}, key=lambda n: list(VARIANTS).index(n) if n in VARIANTS else 99)
    return {n: mean_curve([r for r in results if r["variant"] == n]) for n in names}


def curves_csv(results: list[dict]) -> str:
    """Every seed's curve points (long format)."""
    return _csv(["variant", "seed", "iteration", "train_seconds", *CURVE_KEYS],
                [[r["variant"], r["seed"], p["iteration"], p["train_seconds"], *(p[k] for k in CURVE_KEYS)]
                 for r in sorted(results, key=lambda r: (r["variant"], r["seed"])) for p in r["curve"]])


@dataclass(frozen=True)
class Efficiency:
    """How fast the full method reaches what a reference variant ends with; against vanilla PPO
    this is the paper's efficiency claim.

    ``target`` is the reference's final value of ``metric`` (mean curve over seeds). The full
    method's cost is the first evaluated iteration (and its training seconds) at which its
    mean curve reaches the target; the reference's (``reference_*``) is where its own curve
    first got there. Ratios below 1 mean the full method is faster. ``reference`` names the
    variant compared against (vanilla PPO for the paper's figure; :func:`efficiency_table`
    uses every other variant).
    """

    metric: str
    status: Literal["reached", "never_reached", "no_gain", "missing"]
    reference: str = VANILLA
    target: float | None = None
    start: float | None = None
    """The reference's value at iteration 0 (the shared warm-up)."""
    budget: int | None = None
    full_iterations: int | None = None
    full_seconds: float | None = None
    reference_iterations: int | None = None
    reference_seconds: float | None = None

    @property
    def iteration_ratio(self) -> float | None:
        return self.full_iterations / self.reference_iterations if self.status == "reached" else None

    @property
    def time_ratio(self) -> float | None:
        if self.status != "reached" or not self.reference_seconds:
            return None
        return self.full_seconds / self.reference_seconds

    def sentence(self) -> str:
        if self.status == "missing":
            return f"Efficiency ratio not computed: it needs both `{FULL}` and `{self.reference}` in the variants."
        who = "vanilla PPO" if self.reference == VANILLA else f"`{self.reference}`"
        t = f"{who}'s final {self.metric} ({self.target:.3f})"
        if self.status == "no_gain":
            return (f"Efficiency ratio not defined: {t} is no better than the warm-up's ({self.start:.3f}), "
                    f"so there is no gain whose speed could be compared.")
        if self.status == "never_reached":
            return (f"The full method never reached {t} within the budget of {self.budget} iterations "
                    f"({who} got there at iteration {self.reference_iterations}).")
        text = (f"The full method reached {t} at iteration {self.full_iterations} "
                f"({self.full_seconds:.0f} s of training) vs {who}'s {self.reference_iterations} "
                f"({self.reference_seconds:.0f} s): iteration ratio {self.iteration_ratio:.2f}")
        return text + (f", wall-time ratio {self.time_ratio:.2f}." if self.time_ratio is not None else ".")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "iteration_ratio": self.iteration_ratio, "time_ratio": self.time_ratio,
                "sentence": self.sentence()}


def first_reach(curve: list[dict], metric: str, target: float) -> dict | None:
    return next((p for p in curve if p[metric] >= target - REACH_EPS), None)


def efficiency(curves: dict[str, list[dict]], metric: str = "greedy/em", full: str = FULL,
               reference: str = VANILLA) -> Efficiency:
    """The learning-efficiency figure from mean curves (see :class:`Efficiency`)."""
    if not curves.get(full) or not curves.get(reference):
        return Efficiency(metric, "missing", reference=reference)
    ref, ful = curves[reference], curves[full]
    target, start, budget = ref[-1][metric], ref[0][metric], int(ref[-1]["iteration"])
    common = {"metric": metric, "target": target, "start": start, "budget": budget, "reference": reference}
    if target <= start + REACH_EPS:
        return Efficiency(status="no_gain", **common)
    r = first_reach(ref, metric, target)
    f = first_reach(ful, metric, target)
    if f is None:
        return Efficiency(status="never_reached", reference_iterations=int(r["iteration"]),
                          reference_seconds=r["train_seconds"], **common)
    return Efficiency(status="reached", full_iterations=int(f["iteration"]), full_seconds=f["train_seconds"],
                      reference_iterations=int(r["iteration"]), reference_seconds=r["train_seconds"], **common)


def efficiency_table(curves: dict[str, list[dict]], metric: str = "greedy/em", full: str = FULL) -> list[Efficiency]:
    """The same figure against every other variant with a curve: where the full method first
    reaches each one's final ``metric``, against where that variant got there itself. When
    vanilla PPO gains nothing the paper's ratio is undefined, and these still say how much
    sooner the full method matches each ablation's result."""
    return [efficiency(curves, metric, full, name) for name in curves if name != full]


def efficiency_markdown(rows: list[Efficiency], split: str) -> str:
    """A table of :func:`efficiency_table`: one row per reference variant."""
    head = (f"| against | its final {rows[0].metric if rows else ''} ({split}) | the full method got there at "
            "| it got there at | iteration ratio | time ratio |")
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for e in rows:
        if e.status in ("no_gain", "missing"):
            what = "no gain over the warm-up" if e.status == "no_gain" else "no curve"
            lines.append(f"| `{e.reference}` | {'-' if e.target is None else f'{e.target:.3f}'} | {what} | - | - | - |")
            continue
        got = (f"iteration {e.full_iterations} ({e.full_seconds:.0f} s)" if e.status == "reached"
               else f"never (in {e.budget} iterations)")
        ratio = "-" if e.iteration_ratio is None else f"{e.iteration_ratio:.2f}"
        t_ratio = "-" if e.time_ratio is None else f"{e.time_ratio:.2f}"
        lines.append(f"| `{e.reference}` | {e.target:.3f} | {got} | iteration {e.reference_iterations} "
                     f"({e.reference_seconds:.0f} s) | {ratio} | {t_ratio} |")
    return "\n".join(lines)
