"""The published numbers of a study: tables with spread and provenance, from run records.

A *study* is a set of tracked runs that together make one published result: the ablation
(one flow run per warm-up, each with its (variant, PPO seed) runs) or the default pipeline
run repeated over seeds. ``adapters.report.collect_study`` reads them from MLflow; this module
only sums them up (no MLflow, no Prefect), so every number in ``docs/results/`` is computed
here from run records that name their MLflow run, git commit, DVC data hash and config hash.

A study travels as its **export** (:func:`export_text`, ``docs/results/<study>.jsonl``): JSON
lines, a header then one line per run holding exactly what the tables and the plot are computed
from (variant, warm-up, seed, final, starting and baseline metrics, learning curve or per-
iteration history, the run's parameters, its provenance). ``agentr1 report`` always writes the
export first and renders the markdown and the plot from the file it wrote (:func:`render_study`),
so ``agentr1 report --from <export>`` on a fresh clone, with no MLflow store, makes the same
bytes.

Two kinds of spread are kept apart (the warm-up decided more than PPO's seed in every
experiment so far, docs/experiments/):

- **over warm-ups**: the standard deviation, across warm-ups, of each warm-up's mean over its
  PPO seeds;
- **over seeds**: the standard deviation across PPO seeds from one warm-up, averaged over the
  warm-ups (how much a PPO seed moves the result when the warm-up is fixed).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentr1.ablation import FULL, VARIANTS, efficiency, mean_curve, mean_std
from agentr1.metrics import EM_KEYS
from agentr1.suite import RECIPE_VARIANT, suite_markdown, task_row

HASH_CHARS = 12  # short hashes and commits in tables; the provenance table lists them whole
DIRTY = "+dirty"  # a commit's suffix when the run's code differed from it
# The paper's claims, as (better, worse) variant pairs of the ablation table.
PAPER_ORDERING = (("ppo", "ppo-no-adv-mask"), ("ppo-no-adv-mask", "ppo-no-masks"), ("ppo", "ppo-no-masks"),
                  ("ppo", "ppo-outcome-only"))
FASTER_THAN = "ppo-outcome-only"  # "process rewards learn faster than outcome only"
# Means of EM over runs are multiples of 1/(questions x runs): a smaller difference is float noise.
TIE = 1e-9


@dataclass(frozen=True)
class Provenance:
    """Where a number came from: the MLflow run, and what it ran on."""

    run_id: str
    git_commit: str | None
    """Suffixed :data:`DIRTY` when tracked files differed from the commit as the run started."""
    data_hash: str | None
    config_hash: str | None


@dataclass(frozen=True)
class RunRecord:
    """One tracked run of a study: a (variant, warm-up, seed) cell and what it measured."""

    variant: str
    warmup: str
    """What identifies the warm-up the run started from (its seed and a digest of its weights)."""
    seed: int
    final: dict[str, float]
    """Final held-out metrics (``greedy/em``...)."""
    provenance: Provenance
    start: dict[str, float] = field(default_factory=dict)
    """The same metrics before RL (the warm-up's), where the run measured them."""
    curve: list[dict] = field(default_factory=list)
    """Learning-curve points ``{iteration, train_seconds, greedy/em, ...}`` (ablation runs)."""
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    """The untrained model's metrics on the same questions, by baseline (``eval.baselines``)."""
    history: list[dict] = field(default_factory=list)
    """Per-iteration training metrics ``{iteration, <metric>...}`` (pipeline runs' learning curves)."""
    params: dict[str, str] = field(default_factory=dict)
    """The run's parameters as MLflow holds them (the resolved config, flattened)."""




# ----------------------------------------------------------------------------- spread


@dataclass(frozen=True)
class Spread:
    """A metric over a grid of (warm-up, seed) runs."""

    mean: float
    over_warmups: float
    """Std across warm-ups of the per-warm-up means (NaN for one warm-up)."""
    over_seeds: float
    """Mean over warm-ups of the std across PPO seeds (NaN with one seed per warm-up)."""
    overall: float
    """Std over all runs, the yardstick of :func:`ordering`."""
    warmups: int
    runs: int


def spread(values: dict[str, list[float]]) -> Spread:
    """``values``: warm-up -> the metric of each PPO seed run from it."""
    per_warmup = [mean_std(v) for v in values.values() if v]
    means = [m for m, _ in per_warmup]
    seed_sds = [s for _, s in per_warmup if not math.isnan(s)]
    everything = [x for v in values.values() for x in v]
    mean, over_warmups = mean_std(means)
    return Spread(mean, over_warmups, statistics.fmean(seed_sds) if seed_sds else math.nan,
                  mean_std(everything)[1], len(means), len(everything))


def grid(records: Iterable[RunRecord], variant: str, key: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in records:
        if r.variant == variant and key in r.final:
            out.setdefault(r.warmup, []).append(r.final[key])
    return out


def _num(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def variant_order(names: Iterable[str]) -> list[str]:
    known = list(VARIANTS)
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


# ----------------------------------------------------------------------------- tables


def ablation_table(records: list[RunRecord], keys: tuple[str, ...] = EM_KEYS, split: str = "test") -> str:
    """One row per variant: warm-ups x seeds, then per metric the mean, ± over warm-ups and
    ± over PPO seeds."""
    head = ["variant", "warm-ups x seeds"]
    for k in keys:
        head += [f"{split} {k}", "± warm-ups", "± seeds"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for name in variant_order(r.variant for r in records):
        g = grid(records, name, keys[0])
        label = VARIANTS[name].label if name in VARIANTS else name
        cells = [f"{label} (`{name}`)", f"{len(g)} x {'/'.join(str(len(v)) for v in g.values())}"]
        for k in keys:
            s = spread(grid(records, name, k))
            cells += [f"**{_num(s.mean)}**" if name == FULL else _num(s.mean), _num(s.over_warmups),
                      _num(s.over_seeds)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Claim:
    """One "``better`` beats ``worse`` on ``key``" claim of the paper, as measured."""

    better: str
    worse: str
    key: str
    difference: float
    yardstick: float
    """The larger of the two variants' standard deviations over all their runs."""
    paired: tuple[float, ...] = ()
    """``better`` minus ``worse`` in each (warm-up, PPO seed) cell both ran: the same warm-up and
    the same seed, so the warm-ups' spread, which the yardstick carries, cancels out."""

    @property
    def paired_cell(self) -> str:
        """Mean ± std of the paired differences and how many favour ``better``, e.g.
        ``+0.045 ± 0.017 (6/6)``; n/a without pairs."""
        if not self.paired:
            return "n/a"
        mean, sd = mean_std(list(self.paired))
        sd_text = "" if math.isnan(sd) else f" ± {sd:.3f}"
        return f"{mean:+.3f}{sd_text} ({sum(d > TIE for d in self.paired)}/{len(self.paired)})"

    @property
    def verdict(self) -> str:
        if math.isnan(self.difference):
            return "not measured"
        if math.isnan(self.yardstick):
            return "holds (one run each: no spread to compare with)" if self.difference > 0 else "does not hold"
        if self.difference > self.yardstick:
            return "holds beyond one standard deviation"
        if abs(self.difference) <= TIE:
            return "does not hold (equal means)"
        return "holds, within one standard deviation" if self.difference > 0 else "does not hold (reversed)"


def ordering(records: list[RunRecord], key: str = "greedy/em",
             pairs: tuple[tuple[str, str], ...] = PAPER_ORDERING) -> list[Claim]:
    """Each of the paper's "A beats B" claims, tested on ``key``."""
    claims = []
    for better, worse in pairs:
        a, b = spread(grid(records, better, key)), spread(grid(records, worse, key))
        known = [s.overall for s in (a, b) if not math.isnan(s.overall)]
        yard = max(known) if known else math.nan
        cells = {(r.warmup, r.seed): r.final[key] for r in records if r.variant == worse and key in r.final}
        paired = tuple(r.final[key] - cells[(r.warmup, r.seed)] for r in records
                       if r.variant == better and key in r.final and (r.warmup, r.seed) in cells)
        claims.append(Claim(better, worse, key, a.mean - b.mean, yard, paired))
    return claims


def ordering_markdown(claims: list[Claim]) -> str:
    lines = ["| claim | difference of means | larger std | verdict | paired difference (cells better) |",
             "|---|---:|---:|---|---:|"]
    for c in claims:
        lines.append(f"| `{c.better}` > `{c.worse}` ({c.key}) | {_num(c.difference)} | {_num(c.yardstick)} "
                     f"| {c.verdict} | {c.paired_cell} |")
    return "\n".join(lines)


def speed_claim(records: list[RunRecord], metric: str = "greedy/em", reference: str = FASTER_THAN) -> str:
    """"Process rewards learn faster than outcome only": per warm-up, the iteration at which the
    full method's mean curve reaches ``reference``'s final value over ``reference``'s own
    (``agentr1.ablation.efficiency``), then the ratios' mean ± std over warm-ups."""
    ratios, other = [], []
    for w in sorted({r.warmup for r in records}):
        curves = {name: mean_curve([{"curve": r.curve} for r in records
                                    if r.variant == name and r.warmup == w and r.curve])
                  for name in (FULL, reference)}
        eff = efficiency(curves, metric, FULL, reference)
        if eff.iteration_ratio is not None:
            ratios.append(eff.iteration_ratio)
        else:
            other.append(f"warm-up {w}: {eff.status}")
    if not ratios and not other:
        return f"Speed against `{reference}`: no learning curves in this study."
    mean, sd = mean_std(ratios)
    text = (f"Iterations the full method needs to reach `{reference}`'s final {metric}, over `{reference}`'s own "
            f"(below 1: process rewards learn faster): {_num(mean)} ± {_num(sd)} over {len(ratios)} warm-up(s)")
    return text + (f"; not defined for {'; '.join(other)}." if other else ".")


def pipeline_table(records: list[RunRecord], keys: tuple[str, ...] = EM_KEYS, split: str = "test") -> str:
    """The default run repeated: one row per run (before RL -> after), then mean ± std."""
    head = ["run", "seed", *(f"{split} {k}: warm-up -> after PPO (gain)" for k in keys), "MLflow run"]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---|" * len(keys) + "---|"]
    for i, r in enumerate(sorted(records, key=lambda r: r.seed), 1):
        cells = [str(i), str(r.seed)]
        for k in keys:
            before, after = r.start.get(k, math.nan), r.final.get(k, math.nan)
            cells.append(f"{_num(before)} -> **{_num(after)}** ({after - before:+.3f})")
        lines.append("| " + " | ".join(cells + [f"`{r.provenance.run_id}`"]) + " |")
    if len(records) > 1:
        cells = ["mean ± std", ""]
        for k in keys:
            b = mean_std([r.start.get(k, math.nan) for r in records])
            a = mean_std([r.final.get(k, math.nan) for r in records])
            g = mean_std([r.final.get(k, math.nan) - r.start.get(k, math.nan) for r in records])
            cells.append(f"{_num(b[0])} -> **{_num(a[0])}** ± {_num(a[1])} (gain {_num(g[0])} ± {_num(g[1])})")
        lines.append("| " + " | ".join(cells + [""]) + " |")
    return "\n".join(lines)


BASELINE_LABELS = {"zero_shot": "zero-shot (the instruct model as it comes)",
                   "naive_rag": "naive RAG (a search for the question, then the answer)"}


def baselines_table(records: list[RunRecord], keys: tuple[str, ...] = EM_KEYS, split: str = "test") -> str:
    """The untrained baselines beside the warm-up and the trained agent, on the same questions:
    one row per policy, the mean over runs (± std when there are several)."""
    names = list(dict.fromkeys(b for r in records for b in r.baselines))
    rows = [(BASELINE_LABELS.get(b, b), [r.baselines.get(b, {}) for r in records]) for b in names]
    rows += [("warm-up (supervised, on the demonstrations)", [r.start for r in records]),
             ("after PPO", [r.final for r in records])]
    lines = ["| policy | " + " | ".join(f"{split} {k}" for k in keys) + " |", "|---|" + "---:|" * len(keys)]
    for label, metrics in rows:
        cells = []
        for k in keys:
            mean, std = mean_std([m.get(k, math.nan) for m in metrics])
            cells.append(_num(mean) + (f" ± {_num(std)}" if len(metrics) > 1 else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def groups_of(records: list[RunRecord], mode: str = "greedy") -> list[str]:
    """The groups an environment reported its evaluations by (``{mode}/<group>/em``, e.g. a
    benchmark's categories), hop counts aside, in first-seen order."""
    found = (k.split("/")[1] for r in records for k in r.final if k.count("/") == 2 and k.startswith(f"{mode}/")
             and k.endswith("/em"))
    return [g for g in dict.fromkeys(found) if not (g.startswith("hops") and g[4:].isdigit())]


def group_table(records: list[RunRecord], mode: str = "greedy", split: str = "test") -> str:
    """Exact match per group (a benchmark's category, where its leaderboard reports each): the
    untrained baselines, the warm-up and the trained agent, means over runs (± std), the group's
    size."""
    groups = groups_of(records, mode)
    names = list(dict.fromkeys(b for r in records for b in r.baselines))
    columns = [(BASELINE_LABELS.get(b, b).split(" (")[0], [r.baselines.get(b, {}) for r in records]) for b in names]
    columns += [("warm-up", [r.start for r in records]), ("after PPO", [r.final for r in records])]
    lines = [f"| {split} {mode}/em by group | questions | " + " | ".join(c for c, _ in columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for g in groups:
        n = records[0].final.get(f"{mode}/{g}/n", math.nan)
        cells = []
        for _, metrics in columns:
            mean, std = mean_std([m.get(f"{mode}/{g}/em", math.nan) for m in metrics])
            cells.append(_num(mean) + (f" ± {_num(std)}" if len(metrics) > 1 else ""))
        lines.append(f"| {g} | {n:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _short(value: str | None) -> str:
    if not value:
        return "-"
    base = value.removesuffix(DIRTY)
    return f"`{base[:HASH_CHARS]}`" + (" (uncommitted changes)" if value.endswith(DIRTY) else "")


def provenance_markdown(records: list[RunRecord]) -> str:
    """Every run behind the tables: MLflow run id, git commit, DVC data hash, config hash."""
    lines = ["| variant | warm-up | seed | MLflow run | git commit | DVC data hash | config hash |",
             "|---|---|---:|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (variant_order([r.variant]), r.variant, r.warmup, r.seed)):
        p = r.provenance
        lines.append(f"| `{r.variant}` | {r.warmup} | {r.seed} | `{p.run_id}` | {_short(p.git_commit)} "
                     f"| {_short(p.data_hash)} | {_short(p.config_hash)} |")
    return "\n".join(lines)


def provenance_summary(records: list[RunRecord], data_per_group: bool = False) -> str:
    """One line: the distinct commits and data hashes (a study mixing them says so, unless
    ``data_per_group``: a suite, each task on its own data, where only two in one task mix)."""
    commits = sorted({r.provenance.git_commit or "unknown" for r in records})
    data = sorted({r.provenance.data_hash or "unknown" for r in records})
    groups = {r.warmup for r in records} if data_per_group else {""}
    mixed_data = any(len({r.provenance.data_hash for r in records if not data_per_group or r.warmup == g}) > 1
                     for g in groups)
    mixed = " **(mixed: compare with care)**" if len(commits) > 1 or mixed_data else ""
    if any(c == "unknown" or c.endswith(DIRTY) for c in commits):
        mixed += " **(code not fully recorded: a run without a commit or with uncommitted changes)**"
    return (f"{len(records)} MLflow runs; git commit(s) {', '.join(_short(c) for c in commits)}; "
            f"DVC data hash(es){' (each task its own)' if data_per_group else ''} "
            f"{', '.join(_short(d) for d in data)}{mixed}.")


# ----------------------------------------------------------------------------- including


def markers(name: str) -> tuple[str, str]:
    """The comment lines between which a document includes study ``name``'s summary."""
    return f"<!-- report:{name} -->", f"<!-- /report:{name} -->"


def splice(path: str | Path, name: str, text: str) -> bool:
    """Put ``text`` between ``name``'s markers in the markdown file ``path`` (what was there is
    the previous generation of the same text); returns whether the file changed. The markers count
    only as whole lines outside fenced code blocks (a document may show them as an example), once
    each; the file's line endings are kept. A file without the markers, or with several pairs, is
    an error naming them: nothing of the user's is overwritten."""
    path = Path(path)
    begin, end = markers(name)
    with open(path, encoding="utf-8", newline="") as f:  # as it is: CRLF stays CRLF
        doc = f.read()
    lines = doc.splitlines(keepends=True)
    found: dict[str, list[int]] = {begin: [], end: []}
    fenced = False
    for i, line in enumerate(lines):
        bare = line.strip()
        if bare.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and bare in found:
            found[bare].append(i)
    (starts, stops) = found[begin], found[end]
    if not starts or not stops or stops[0] < starts[0]:
        raise ValueError(f"{path}: no '{begin}' ... '{end}' block to put the {name} report in")
    if len(starts) > 1 or len(stops) > 1:
        raise ValueError(f"{path}: {len(starts)} '{begin}' and {len(stops)} '{end}' lines: one block per report")
    eol = "\r\n" if lines[starts[0]].endswith("\r\n") else "\n"
    body = [f"{line}{eol}" for line in text.strip().split("\n")]
    new = "".join([*lines[:starts[0] + 1], *body, *lines[stops[0]:]])
    if new != doc:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(new)
    return new != doc


# ----------------------------------------------------------------------------- export and render

STUDY_NAME = re.compile(r"^[\w.-]+$")
"""What a study may be called: it names the files its report writes (``<out>/<study>.md``)."""
EXPORT_FORMAT = "agentr1-study/1"
EXPORT_SUFFIX = ".jsonl"


@dataclass
class Study:
    """A study's runs and how it was made: what :func:`render_study` needs, and no more."""

    name: str
    kind: Literal["ablation", "pipeline", "suite"]
    """A suite's records are its tasks' ablation runs, the task in ``warmup`` (one warm-up per task)."""
    split: str
    command: str
    """The command that exported it (named under the tables)."""
    records: list[RunRecord]


def _finite(obj):
    """``obj`` with NaN and infinities as None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _nan(values: Any) -> dict[str, float]:
    """Metrics as read from an export: numbers, with null (how NaN is written) back to NaN; a
    TypeError naming the metric for anything else."""
    if not isinstance(values, dict):
        raise TypeError(f"expected an object of metrics, got {type(values).__name__}")
    for k, v in values.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise TypeError(f"metric {k!r}: expected a number or null, got {v!r:.40}")
    return {k: math.nan if v is None else v for k, v in values.items()}


def export_text(study: Study) -> str:
    """The study as JSON lines: a header, then one run per line (module docstring)."""
    head = {"format": EXPORT_FORMAT, "study": study.name, "kind": study.kind, "split": study.split,
            "command": study.command, "runs": len(study.records)}
    lines = [json.dumps(head, sort_keys=True)]
    lines += [json.dumps(_finite(dataclasses.asdict(r)), sort_keys=True, allow_nan=False) for r in study.records]
    return "\n".join(lines) + "\n"


def read_export(path: str | Path) -> Study:
    """A study from its export; ValueError naming the file, line and field of what is wrong."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the export: {err}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON: {err.msg}") from None
    head = rows[0] if rows and isinstance(rows[0], dict) else {}
    if head.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}:1: field 'format': expected {EXPORT_FORMAT!r}, got {head.get('format')!r}")
    for key in ("study", "command"):
        if not isinstance(head.get(key), str):
            raise ValueError(f"{path}:1: field {key!r}: expected a string, got {head.get(key)!r:.60}")
    if not STUDY_NAME.match(head["study"]):  # it names the files the report writes
        raise ValueError(f"{path}:1: field 'study': {head['study']!r:.60} is not a name of letters, digits, "
                         "'.', '_' or '-'")
    records = []
    for number, row in enumerate(rows[1:], start=2):
        try:
            records.append(RunRecord(
                row["variant"], row["warmup"], int(row["seed"]), _nan(row["final"]), Provenance(**row["provenance"]),
                start=_nan(row.get("start", {})), curve=[_nan(p) for p in row.get("curve", [])],
                baselines={b: _nan(m) for b, m in row.get("baselines", {}).items()},
                history=[_nan(p) for p in row.get("history", [])], params=row.get("params", {})))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{path}:{number}: a run line lacks or misstates a field: {err}") from None
    if head.get("kind") not in ("ablation", "pipeline", "suite") or len(records) != head.get("runs"):
        raise ValueError(f"{path}:1: field 'kind' or 'runs': kind {head.get('kind')!r}, {head.get('runs')} runs "
                         f"announced, {len(records)} found")
    return Study(head["study"], head["kind"], head.get("split", "test"), head["command"], records)


def suite_rows(records: list[RunRecord]):
    """A suite's table rows (:func:`agentr1.suite.task_row`), one per task, by task name."""
    by_task: dict[str, list[dict]] = {}
    for r in records:
        by_task.setdefault(r.warmup, []).append({"variant": r.variant, "seed": r.seed, "final": r.final,
                                                 "kind": VARIANTS[r.variant].kind, "train_seconds": 0.0})
    return [task_row(task, runs) for task, runs in sorted(by_task.items())]


def render_study(study: Study, out_dir: str | Path, include: Iterable[str | Path] = (),
                 export: str | Path | None = None) -> dict[str, Path]:
    """``<out_dir>/<name>.md`` and ``<name>.png`` from the study's records: for an ablation the
    table with spread over warm-ups and over seeds, the paper's claims tested and the learning
    curves; for repeated pipeline runs EM before -> after RL per run, mean ± std, the baselines
    when there are some, the learning curves; every number with its MLflow run, git commit, data
    hash and config hash. The summary also goes between the study's markers in each ``include``
    file (:func:`splice`). ``export``: the export file the study was read from, linked."""
    from agentr1.plots import plot_ablation_curves, plot_learning_curve

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name, records, split = study.name, study.records, study.split
    md, png = out / f"{name}.md", out / f"{name}.png"
    lines = []
    if study.kind == "ablation":
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
                  "over all their runs; the *paired difference* is the mean ± std, over the (warm-up, PPO seed) "
                  "cells both variants ran, of the one minus the other from the same warm-up and seed, with how "
                  "many cells favour the first):", "",
                  ordering_markdown([c for key in EM_KEYS for c in ordering(records, key)]), "",
                  speed_claim(records), ""]
    elif study.kind == "suite":
        tasks = sorted({r.warmup for r in records})
        curves = {t: mean_curve([{"curve": r.curve} for r in records if r.warmup == t and r.variant == RECIPE_VARIANT
                                 and r.curve]) for t in tasks}
        plot_ablation_curves({t: c for t, c in curves.items() if c}, png, split="dev",
                             title=f"suite {name}: the recipe's held-out exact match per task (mean ± std over seeds)")
        lines += [suite_markdown(suite_rows(records)), ""]
    else:
        histories = {f"seed {r.seed} ({r.provenance.run_id[:8]})": r.history for r in records}
        plot_learning_curve({k: h for k, h in histories.items() if h}, png, title=f"study {name}: masked PPO")
        lines += [pipeline_table(records, split=split), ""]
        if any(r.baselines for r in records):
            lines += ["The untrained model's baselines on the same questions, beside the warm-up and the "
                      "trained agent:", "", baselines_table(records, split=split), ""]
        if groups_of(records):
            lines += ["By the groups the environment reports (a benchmark's categories):", "",
                      group_table(records, split=split), ""]
    source = f" from `{Path(export).name}`" if export else ""
    lines.append(f"Generated by `{study.command}`{source}. **Provenance**: "
                 f"{provenance_summary(records, data_per_group=study.kind == 'suite')}")
    summary = "\n".join(lines)
    md.write_text("\n".join([f"<!-- generated by `{study.command}`; do not edit by hand -->", "", summary, "",
                             f"![{name}]({png.name})", "", provenance_markdown(records), ""]), encoding="utf-8")
    for path in include:  # links to the per-run table and the plot, relative to the including file
        here = Path(path).resolve().parent
        link, plot = (Path(os.path.relpath(p.resolve(), here)).as_posix() for p in (md, png))
        splice(path, name, f"{summary} Per run: [{md.name}]({link}).\n\n![{name}]({plot})")
    return {"markdown": md, "plot": png}
