"""The task suite's table: for every task, the warm-up and the recipe's final policy on its test
split, greedy and sampled exact match, mean ± std over seeds, and the gain.

A suite (``conf/suite/<name>.yaml``, run by ``flows/suite.py``) is one ablation per task with
two variants: ``base-tool-call`` (the warm-up, evaluated as the final policy is) and ``ppo``
(the recipe); this module turns their per-run results into the table, with no Prefect or MLflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from agentr1.ablation import FULL, Row, _csv, _pm, mean_std, summarize
from agentr1.metrics import EM_KEYS

WARMUP_VARIANT = "base-tool-call"
RECIPE_VARIANT = FULL
SUITE_VARIANTS = (WARMUP_VARIANT, RECIPE_VARIANT)


@dataclass(frozen=True)
class TaskRow:
    """One task of the suite: the warm-up's and the recipe's final metrics over seeds."""

    task: str
    seeds: int
    warmup: dict[str, tuple[float, float]]
    final: dict[str, tuple[float, float]]
    gain: dict[str, tuple[float, float]]
    """metric -> (mean, std) over seeds of final minus warm-up, seed by seed."""


def task_row(task: str, runs: list[dict]) -> TaskRow:
    """The row of ``task`` from its ablation's runs (``variant``, ``seed``, ``kind``, ``final``,
    ``train_seconds`` each)."""
    rows: dict[str, Row] = {r.variant: r for r in summarize(runs, EM_KEYS)}
    missing = [v for v in SUITE_VARIANTS if v not in rows]
    if missing:
        raise ValueError(f"suite task {task!r}: no {' or '.join(missing)} run finished")
    warm = {r["seed"]: r["final"] for r in runs if r["variant"] == WARMUP_VARIANT}
    gains = {m: [r["final"][m] - warm[r["seed"]][m] for r in runs
                 if r["variant"] == RECIPE_VARIANT and r["seed"] in warm] for m in EM_KEYS}
    return TaskRow(task, rows[RECIPE_VARIANT].seeds, rows[WARMUP_VARIANT].stats, rows[RECIPE_VARIANT].stats,
                   {m: mean_std(g) for m, g in gains.items()})


def mean_gain(rows: list[TaskRow], metric: str) -> float:
    """The suite's headline: the mean over tasks of the mean gain in ``metric``."""
    return math.fsum(r.gain[metric][0] for r in rows) / len(rows) if rows else math.nan


def suite_markdown(rows: list[TaskRow]) -> str:
    """The table: one row per task, then the mean gain over the tasks."""
    header = ["task", "seeds"] + [f"{m} {w}" for m in EM_KEYS for w in ("warm-up", "final", "gain")]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for r in rows:
        cells = [r.task, str(r.seeds)]
        for m in EM_KEYS:
            cells += [_pm(*r.warmup[m]), _pm(*r.final[m]), _signed(*r.gain[m])]
        lines.append("| " + " | ".join(cells) + " |")
    gains = ", ".join(f"{m} {mean_gain(rows, m):+.3f}" for m in EM_KEYS)
    return "\n".join(lines) + f"\n\nMean gain over the {len(rows)} tasks: {gains}."


def _signed(mean: float, std: float) -> str:
    return _pm(mean, std) if math.isnan(mean) else ("+" if mean >= 0 else "") + _pm(mean, std)


def suite_csv(rows: list[TaskRow]) -> str:
    header = ["task", "seeds"] + [f"{m}_{w}_{s}" for m in EM_KEYS for w in ("warmup", "final", "gain")
                                  for s in ("mean", "std")]
    body = [[r.task, r.seeds, *(x for m in EM_KEYS for part in (r.warmup, r.final, r.gain) for x in part[m])]
            for r in rows]
    return _csv(header, body)
