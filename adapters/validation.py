"""Data checks with Great Expectations: QA splits, the corpus, and each batch of rollouts.

GX runs in-process on an ephemeral context; every data asset is a pandas dataframe and every
suite is built here in code, once per process (module-level cache, GX is slow to import).

Raw rows are never trusted to parse: a JSON-lines file is read line by line, a line that is
not a JSON object becomes a failing row of its own (with its line number), and each field is
turned into a *helper column* that is always computable (``question_len``, ``n_answers``,
``n_missing_support``, ... with ``-1`` for a missing or mistyped field). The record rules are the
engine's (``agentr1.data.records.QA_RULES``/``DOC_RULES``, by which every loader checks a row):
one definition, run there and here as expectations. The expectations run
on the helper columns; a report then shows, for a few failing rows, the file, the line (or the
Parquet row), the field a person has to fix and that field's raw value.

A dataset is first checked by the engine (``agentr1.data.records.check_dataset``, what the
training loader and ``agentr1 data validate`` run), so every entry point gives one verdict; the
suites run on a dataset that passed it, with the engine's limits (hops, field and line sizes).

    report = validate_qa_split("data/qa/train.jsonl", corpus_ids)
    raise_on_failure(validate_dataset("data"))   # ValidationFailed: str() is the markdown report
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from agentr1.data.records import (DOC_RULES, MAX_LINE_BYTES, QA_DIR, QA_RULES, DataError, FieldRule,
                                  available_splits, check_dataset, corpus_path, iter_json_lines, split_path)
from agentr1.errors import UserError
from agentr1.rollout import checks as rollout_checks

DEFAULT_REWARD_BOUNDS = (-2.0, 3.0)
SAMPLE_ROWS = 5
"""Failing rows shown per failed expectation."""
MAX_VALUE_CHARS = 120
MISSING = "<missing>"
INDEX = "_i"  # positional row index; GX returns it for every failing row
DATASET_SOURCE = f"{QA_DIR}/*.jsonl"


# ---------------------------------------------------------------- reports


@dataclass
class ValidationReport:
    """Outcome of one suite on one source.

    ``failures``: one dict per failed expectation with keys ``check``, ``rule`` (in words),
    ``expectation`` (GX type), ``column`` (the checked helper column), ``field`` (what to fix),
    ``observed`` (e.g. "2 of 200 rows (1.0%)"), ``unexpected_count`` and ``rows``: a sample of
    failing rows, each ``{"file", "line" | "row", "id", "field", "value"}``.
    """

    suite: str
    success: bool
    n_rows: int
    failures: list[dict] = field(default_factory=list)
    source: str = ""
    n_checks: int = 0

    def to_markdown(self) -> str:
        where = f" on `{self.source}`" if self.source else ""
        if self.success:
            return f"### Validation passed: `{self.suite}`{where} ({self.n_rows} rows, {self.n_checks} checks)\n"
        lines = [f"### Validation FAILED: `{self.suite}`{where} ({self.n_rows} rows)", "",
                 f"{len(self.failures)} of {self.n_checks} checks failed.", ""]
        for k, f in enumerate(self.failures, start=1):
            lines += _failure_markdown(k, f)
        return "\n".join(lines)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _failure_markdown(k: int, f: dict) -> list[str]:
    column = f" on column `{f['column']}`" if f.get("column") else ""
    out = [f"**{k}. {f['rule']}**: field `{f['field']}`, {f['observed']}  ",
           f"(`{f['expectation']}`{column})", ""]
    if f["rows"]:
        out += ["| where | id | field | value |", "|---|---|---|---|"]
        for r in f["rows"]:
            where = f"{r['file']}:{r['line']}" if "line" in r else f"{r['file']} row {r['row']}"
            out.append(f"| {_cell(where)} | {_cell(r['id'])} | {_cell(r['field'])} | {_cell(r['value'])} |")
        if f["unexpected_count"] > len(f["rows"]):
            out.append(f"\n... and {f['unexpected_count'] - len(f['rows'])} more rows")
        out.append("")
    return out


class ValidationFailed(UserError):
    """A suite failed; ``str(e)`` is the report's markdown."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.to_markdown())


def raise_on_failure(reports: Iterable[ValidationReport]) -> None:
    """Raise ``ValidationFailed`` with the first failing report; return quietly if all passed."""
    for report in reports:
        if not report.success:
            raise ValidationFailed(report)


def summary_markdown(reports: Iterable[ValidationReport]) -> str:
    """Every report's markdown, failures first (for one artifact covering a whole dataset)."""
    ordered = sorted(reports, key=lambda r: r.success)
    return "\n".join(r.to_markdown() for r in ordered)


# ---------------------------------------------------------------- checks (declarative)


@dataclass(frozen=True)
class Check:
    """One expectation on a helper column, with the words a report uses for it."""

    name: str          # unique within a suite; stored in the expectation's meta
    rule: str          # what must hold, in words; ``{param}`` placeholders are filled in
    field: str         # the field of the raw data a person fixes
    show: str          # frame column displayed as the failing row's value
    expectation: str   # class name in ``great_expectations.expectations``
    kwargs: dict


def _param(name: str) -> dict:
    """A suite parameter, filled in at validation time (suites are built once)."""
    return {"$PARAMETER": name}


def _between(name: str, rule: str, field_: str, column: str, show: str, lo: Any = None, hi: Any = None) -> Check:
    return Check(name, rule, field_, show, "ExpectColumnValuesToBeBetween",
                 {"column": column, "min_value": lo, "max_value": hi})


def _zero(name: str, rule: str, field_: str, column: str, show: str) -> Check:
    return _between(name, rule, field_, column, show, 0, 0)


def _has_rows(what: str) -> Check:
    return Check("has_rows", f"the {what} has at least one row", "(file)", "", "ExpectTableRowCountToBeBetween",
                 {"min_value": 1})


def _record_checks(what: str, rules: tuple[FieldRule, ...]) -> list[Check]:
    """Rows parse, ids are unique, every field keeps its rule (the engine's, ``records.QA_RULES`` /
    ``DOC_RULES``, as expectations on the helper columns of :meth:`FieldRule.columns`)."""
    return [
        _has_rows("file"),
        Check("json", f"each line is a JSON object in UTF-8, at most {MAX_LINE_BYTES} bytes", "(line)",
              "parse_error", "ExpectColumnValuesToBeNull",
              {"column": "parse_error"}),
        Check("id_unique", f"{what} ids are unique within the file", "id", "v_id", "ExpectColumnValuesToBeUnique",
              {"column": "id"}),
        *(_between(name, rule, r.name, column, f"v_{r.name}", lo, hi)
          for r in rules for name, rule, column, lo, hi in r.checks()),
    ]


QA_CHECKS = _record_checks("record", QA_RULES) + [
    _zero("support", "every supporting_docs id is a doc id of the corpus", "supporting_docs",
          "n_missing_support", "v_missing_support"),
]
CORPUS_CHECKS = _record_checks("document", DOC_RULES)

DATASET_CHECKS = [
    _has_rows("dataset (all QA splits together)"),
    Check("id_unique_across", "record ids are unique across all splits", "id", "v_id",
          "ExpectColumnValuesToBeUnique", {"column": "id"}),
]

# The rollout rules are the engine's (agentr1.rollout.checks), which the PPO loop also checks in
# memory before every update: one definition, run there and here as GX expectations.
ROLLOUT_CHECKS = [_has_rows("batch")] + [
    _between(r.name, r.rule, r.field, r.column, r.show,
             _param(r.lo) if isinstance(r.lo, str) else r.lo, _param(r.hi) if isinstance(r.hi, str) else r.hi)
    for r in rollout_checks.RULES
]

SUITES: dict[str, list[Check]] = {
    "qa_split": QA_CHECKS, "corpus": CORPUS_CHECKS, "qa_dataset": DATASET_CHECKS, "rollouts": ROLLOUT_CHECKS,
}


# ---------------------------------------------------------------- GX, once per process


@dataclass
class _Gx:
    context: Any
    batch_definitions: dict[str, Any]
    suites: dict[str, Any]


_GX: _Gx | None = None
# GX contexts are not thread-safe; Prefect may run tasks in threads.
_LOCK = threading.Lock()


def _build_gx() -> _Gx:
    # No network on the training machines: GX must not try to send usage statistics.
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    # tqdm bars from every metric computation would flood test output and Prefect logs.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    state = _Gx(context, {}, {})
    context.data_sources.add_pandas("agentr1")
    for name, checks in SUITES.items():
        _add_suite(state, name, checks)
    return state


def _add_suite(state: _Gx, name: str, checks: list[Check]) -> None:
    import great_expectations as gx

    asset = state.context.data_sources.get("agentr1").add_dataframe_asset(name)
    state.batch_definitions[name] = asset.add_batch_definition_whole_dataframe(name)
    suite = gx.ExpectationSuite(name=name)
    for c in checks:
        suite.add_expectation(getattr(gx.expectations, c.expectation)(**c.kwargs, meta={"check": c.name}))
    state.suites[name] = state.context.suites.add(suite)


def _run_gx(suite: str, frame: pd.DataFrame, params: dict) -> Any:
    """GX's validation result for ``frame``; failing rows are identified by the ``_i`` column."""
    global _GX
    result_format = {"result_format": "SUMMARY", "unexpected_index_column_names": [INDEX],
                     "partial_unexpected_count": SAMPLE_ROWS, "return_unexpected_index_query": False}
    with _LOCK:
        if _GX is None:
            _GX = _build_gx()
        if suite not in _GX.suites:  # an environment kind's suite, made when first used
            _add_suite(_GX, suite, SUITES[suite])
        batch = _GX.batch_definitions[suite].get_batch(batch_parameters={"dataframe": frame})
        return batch.validate(_GX.suites[suite], expectation_parameters=params, result_format=result_format)


# ---------------------------------------------------------------- results -> report


def _failure(check: Check, gx_result: Any, frame: pd.DataFrame, params: dict) -> dict:
    res = dict(gx_result.result or {})
    exc = gx_result.exception_info or {}
    if exc.get("raised_exception"):
        observed, count = f"the expectation raised: {exc.get('exception_message')}", 0
    elif "unexpected_count" in res:
        count, total = int(res["unexpected_count"]), int(res.get("element_count") or 0)
        observed = f"{count} of {total} rows fail ({100 * count / max(total, 1):.1f}%)"
    else:
        observed, count = f"observed {res.get('observed_value')}", 0
    indices = [int(d[INDEX]) for d in res.get("partial_unexpected_index_list") or []][:SAMPLE_ROWS]
    return {"check": check.name, "rule": check.rule.format(**params), "expectation": gx_result.expectation_config.type,
            "column": check.kwargs.get("column"), "field": check.field, "observed": observed,
            "unexpected_count": count, "rows": [_row_sample(frame, i, check) for i in indices]}


def _row_sample(frame: pd.DataFrame, i: int, check: Check) -> dict:
    row = frame.iloc[i]
    loc = {"line": int(row["line"])} if "line" in frame.columns else {"row": int(row["row"])}
    return {"file": row["file"], **loc, "id": row["rid"], "field": check.field, "value": row[check.show]}


def _validate(suite: str, frame: pd.DataFrame, source: str, params: dict) -> ValidationReport:
    checks = {c.name: c for c in SUITES[suite]}
    result = _run_gx(suite, frame, params)
    failures = [_failure(checks[r.expectation_config.meta["check"]], r, frame, params)
                for r in result.results if not r.success]
    order = list(checks)
    failures.sort(key=lambda f: order.index(f["check"]))
    return ValidationReport(suite, not failures, len(frame), failures, source, len(checks))


def _unreadable(suite: str, source: str, message: str) -> ValidationReport:
    """A source GX cannot even look at (missing file, not Parquet, columns absent)."""
    failure = {"check": "readable", "rule": "the source exists and can be read", "expectation": "(read)",
               "column": None, "field": "(file)", "observed": message, "unexpected_count": 0, "rows": []}
    return ValidationReport(suite, False, 0, [failure], source, 1)


# ---------------------------------------------------------------- JSON lines -> frames


_ABSENT = object()  # a key missing from a JSON object (distinct from an explicit null)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _show(value: Any) -> str:
    """A raw JSON value as a report shows it (repr, so that '' and None stay visible)."""
    return _clip(MISSING if value is _ABSENT else repr(value))


def _read_lines(path: Path) -> list[tuple[int, Any, str | None]]:
    """(line number, JSON object or None, problem or None) for every non-blank line, read by the
    engine's reader (the same UTF-8, size and JSON rules and line numbers as the loaders)."""
    out = []
    for number, obj, error in iter_json_lines(path):
        if error is None and not isinstance(obj, dict):
            error = DataError(path, number, None, f"expected a JSON object, got {type(obj).__name__}")
        out.append((number, None if error else obj, error.message if error else None))
    return out


def _id_columns(obj: dict) -> dict:
    rid = obj.get("id")
    return {"id": rid if isinstance(rid, str) else None, "rid": rid if isinstance(rid, str) else ""}


def _rule_columns(obj: dict, rules: tuple[FieldRule, ...]) -> dict:
    """The helper columns of ``rules`` and each field's raw value (``v_<field>``) as shown."""
    out: dict[str, Any] = {}
    for r in rules:
        out.update(r.columns(obj))
        out[f"v_{r.name}"] = _show(obj.get(r.name, _ABSENT))
    return out


def _rule_column_names(rules: tuple[FieldRule, ...]) -> list[str]:
    return [c for r in rules for c in (*dict.fromkeys(check[2] for check in r.checks()), f"v_{r.name}")]


def _jsonl_frame(path: Path, derive: Callable[[dict], dict], columns: list[str]) -> pd.DataFrame:
    """One row per non-blank line; helper columns stay NaN on lines that did not parse (GX skips them)."""
    rows = []
    for i, (line, obj, error) in enumerate(_read_lines(path)):
        row = {INDEX: i, "file": str(path), "line": line, "parse_error": error, "rid": ""}
        if obj is not None:
            row.update(_id_columns(obj))
            row.update(derive(obj))
        rows.append(row)
    base = [INDEX, "file", "line", "parse_error", "id", "rid"]
    return pd.DataFrame.from_records(rows, columns=base + columns)


def _qa_columns(obj: dict, corpus_ids: set[str]) -> dict:
    support = obj.get("supporting_docs", _ABSENT)
    if isinstance(support, list):
        missing = [d for d in support if not isinstance(d, str) or d not in corpus_ids]
        shown_support = f"not in the corpus: {_show(missing)}" if missing else _show(support)
    else:
        missing, shown_support = [support], f"not a list: {_show(support)}"
    return {**_rule_columns(obj, QA_RULES), "n_missing_support": len(missing), "v_missing_support": shown_support}


QA_COLUMNS = [*_rule_column_names(QA_RULES), "n_missing_support", "v_missing_support"]
DOC_COLUMNS = _rule_column_names(DOC_RULES)


def _read_error(path: Path) -> str | None:
    if not path.is_file():
        return f"{path}: no such file"
    if not os.access(path, os.R_OK):
        return f"{path}: not readable"
    return None


# ---------------------------------------------------------------- public: datasets


def _qa_frame(path: Path, corpus_ids: set[str]) -> pd.DataFrame:
    return _jsonl_frame(path, lambda obj: _qa_columns(obj, corpus_ids), QA_COLUMNS)


def _corpus_frame(path: Path) -> pd.DataFrame:
    return _jsonl_frame(path, lambda obj: _rule_columns(obj, DOC_RULES), DOC_COLUMNS)


def validate_qa_split(path: str | os.PathLike, corpus_ids: set[str]) -> ValidationReport:
    """QA records of one JSON-lines file: see ``QA_CHECKS``."""
    path = Path(path)
    if (error := _read_error(path)) is not None:
        return _unreadable("qa_split", str(path), error)
    return _validate("qa_split", _qa_frame(path, corpus_ids), str(path), {})


def validate_corpus(path: str | os.PathLike) -> ValidationReport:
    """Documents of one JSON-lines file: see ``CORPUS_CHECKS``."""
    return _validate_corpus(Path(path))[0]


def _validate_corpus(path: Path) -> tuple[ValidationReport, set[str]]:
    """The corpus report and the doc ids found (empty when the file cannot be read)."""
    if (error := _read_error(path)) is not None:
        return _unreadable("corpus", str(path), error), set()
    frame = _corpus_frame(path)
    ids = {i for i in frame["id"] if isinstance(i, str)}
    return _validate("corpus", frame, str(path), {}), ids


def _dataset_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """(file, line, id) of every parsed QA row of every split, for the across-split checks."""
    cols = [INDEX, "file", "line", "id", "v_id", "rid"]
    parts = [f[cols] for f in frames if len(f)]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    frame[INDEX] = range(len(frame))
    return frame


def records_report(data_dir: str | os.PathLike, errors: list[DataError]) -> ValidationReport:
    """The engine's schema check (``agentr1.data.records.check_dataset``) as a failed report: one
    row per problem, with its file, line and field."""
    rows = [{"file": e.path, "line": e.line or 0, "id": "", "field": e.field or "", "value": e.message}
            for e in errors]
    failure = {"check": "records", "rule": "the dataset passes the record schema (agentr1 data validate)",
               "expectation": "(agentr1.data.records.check_dataset)", "column": None,
               # the field to fix, without an item index (each row keeps its own, e.g. answers[1])
               "field": (errors[0].field or "(row)").split("[")[0], "observed": f"{len(errors)} problem(s)",
               "unexpected_count": len(errors), "rows": rows}
    return ValidationReport("records", False, 0, [failure], str(data_dir), 1)


def validate_dataset(data_dir: str | os.PathLike, env_kind: str | None = None) -> list[ValidationReport]:
    """The engine's schema check (the verdict of every other entry point) as the ``records``
    report when it fails, else the GX suites (``suite_reports``, with ``env_kind``'s own), which
    use the engine's limits."""
    errors = check_dataset(data_dir)
    return [records_report(data_dir, errors)] if errors else suite_reports(data_dir, env_kind)


def suite_reports(data_dir: str | os.PathLike, env_kind: str | None = None) -> list[ValidationReport]:
    """The GX suites alone: the corpus, every split under DIR/qa, and record ids across splits
    (in that order); then, given the run's environment kind, its own suite (``env_<kind>``: what
    its records must satisfy, e.g. gold calls for the warm-up) on the splits it covers."""
    corpus_report, corpus_ids = _validate_corpus(corpus_path(data_dir))
    reports, frames = [corpus_report], []
    for split in available_splits(data_dir):
        path = split_path(data_dir, split)
        frames.append(_qa_frame(path, corpus_ids))
        reports.append(_validate("qa_split", frames[-1], str(path), {}))
    source = str(Path(data_dir) / DATASET_SOURCE)
    reports.append(_validate("qa_dataset", _dataset_frame(frames), source, {}))
    return reports + (env_reports(data_dir, env_kind) if env_kind else [])


def env_suite(kind: str) -> tuple[str, list]:
    """The suite name and the record rules of environment ``kind`` (``agentr1.env.registry``)."""
    from agentr1.env.registry import env_kind

    rules = env_kind(kind).record_rules
    name = f"env_{kind}"
    # Rules are plain words here: braces in them are text, not suite parameters.
    SUITES.setdefault(name, [_zero(r.name, r.rule.replace("{", "{{").replace("}", "}}"), r.field, f"kind_{r.name}",
                                   f"v_kind_{r.name}") for r in rules])
    return name, list(rules)


def env_reports(data_dir: str | os.PathLike, kind: str) -> list[ValidationReport]:
    """Environment ``kind``'s suite on each split its rules cover (none: no report)."""
    name, rules = env_suite(kind)
    reports = []
    for split in available_splits(data_dir):
        applying = [r for r in rules if split in r.splits]
        if not applying:
            continue
        path = split_path(data_dir, split)
        columns = [c for r in rules for c in (f"kind_{r.name}", f"v_kind_{r.name}")]

        def derive(obj: dict) -> dict:
            # A rule that does not cover this split holds by definition here.
            return {k: v for r in rules for k, v in (
                (f"kind_{r.name}", r.problems(obj) if r in applying else 0),
                (f"v_kind_{r.name}", _show(obj.get(r.field, _ABSENT))))}

        reports.append(_validate(name, _jsonl_frame(path, derive, columns), str(path), {}))
    return reports


# ---------------------------------------------------------------- public: rollouts


ROLLOUT_REQUIRED = ("record_id", "token_ids", "action_mask", "rollout_logprobs", "prompt_len", "turn_ends",
                    "process_rewards", "outcome_reward")


def _rollout_frame(table: pa.Table, source: str) -> pd.DataFrame:
    rows = []
    for i, r in enumerate(table.select(list(ROLLOUT_REQUIRED)).to_pylist()):
        rows.append({INDEX: i, "file": source, "row": i, "rid": r["record_id"] or "", **rollout_checks.episode_columns(r)})
    # Columns named explicitly so that an empty batch still has them (and fails only has_rows).
    columns = [INDEX, "file", "row", "rid", *rollout_checks.episode_columns({})]
    return pd.DataFrame.from_records(rows, columns=columns)


def validate_rollouts(path_or_table: str | os.PathLike | pa.Table, max_length: int,
                      reward_bounds: tuple[float, float] = DEFAULT_REWARD_BOUNDS) -> ValidationReport:
    """One batch of rollouts (a Parquet file written by ``agentr1.rollout.store`` or its table)."""
    if isinstance(path_or_table, pa.Table):
        table, source = path_or_table, "<table>"
    else:
        source = str(path_or_table)
        try:
            table = pq.read_table(path_or_table)
        except (OSError, pa.ArrowException) as e:
            return _unreadable("rollouts", source, f"{source}: cannot read as Parquet ({e})")
    missing = [c for c in ROLLOUT_REQUIRED if c not in table.column_names]
    if missing:
        return _unreadable("rollouts", source, f"{source}: required columns missing: {missing}")
    params = {"max_length": max_length, "reward_lo": reward_bounds[0], "reward_hi": reward_bounds[1]}
    return _validate("rollouts", _rollout_frame(table, source), source, params)
