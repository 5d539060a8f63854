"""Great Expectations suites: clean data passes; each fault fails naming file, row and field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentr1.data import records as R
from agentr1.data.generated import write_dataset
from agentr1.env.qa.synth import generate
from agentr1.rollout import store
from adapters import validation as V
from test_store import make_trajectories

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory) -> Path:
    splits, corpus = generate(0, n_train=30, n_dev=10, n_test=10)
    out = tmp_path_factory.mktemp("clean") / "data"
    write_dataset(out, splits, corpus)
    return out


@pytest.fixture()
def data_dir(clean_dir, tmp_path) -> Path:
    """A fresh copy of the clean dataset, free to corrupt."""
    return Path(shutil.copytree(clean_dir, tmp_path / "data"))


def edit_line(path: Path, line: int, change) -> None:
    """Replace 1-based ``line`` of a JSON-lines file by change(obj) (a dict, or raw text)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    new = change(json.loads(lines[line - 1]))
    lines[line - 1] = new if isinstance(new, str) else json.dumps(new)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def with_(**fields):
    return lambda obj: {**obj, **fields}


def failure(report: V.ValidationReport, check: str) -> dict:
    assert not report.success, report.to_markdown()
    found = [f for f in report.failures if f["check"] == check]
    assert found, f"expected check {check!r} to fail:\n{report.to_markdown()}"
    return found[0]


def assert_names(report, check, file: Path, field: str, line: int | None = None, row: int | None = None,
                 value_has: str | None = None) -> dict:
    """The failure names the file, the line (or Parquet row) and the field, also in the markdown."""
    f = failure(report, check)
    assert f["field"] == field
    hits = [r for r in f["rows"] if Path(r["file"]) == file and r.get("line") == line and r.get("row") == row]
    assert hits, f["rows"]
    assert hits[0]["field"] == field
    if value_has is not None:
        assert value_has in hits[0]["value"]
    md = report.to_markdown()
    where = f"{file}:{line}" if line is not None else f"{file} row {row}"
    assert where in md and f"`{field}`" in md and f["rule"] in md
    return f


def split_report(reports, split: str) -> V.ValidationReport:
    return next(r for r in reports if r.source.endswith(f"{split}.jsonl"))


# ---------------------------------------------------------------- datasets


def test_clean_dataset_passes_every_suite(clean_dir):
    reports = V.validate_dataset(clean_dir)
    assert [r.suite for r in reports] == ["corpus", "qa_split", "qa_split", "qa_split", "qa_dataset"]
    assert all(r.success for r in reports), V.summary_markdown(reports)
    assert [r.n_rows for r in reports[1:4]] == [10, 10, 30]  # dev, test, train
    V.raise_on_failure(reports)  # does not raise
    assert "passed" in reports[0].to_markdown()


@pytest.mark.parametrize("line, change, check, field, value_has", [
    (3, with_(answers=[]), "answers_list", "answers", "[]"),
    (4, lambda o: {k: v for k, v in o.items() if k != "answers"}, "answers_list", "answers", "<missing>"),
    (5, with_(answers=["ok", "  "]), "answers_items", "answers", "'  '"),
    (6, with_(question=""), "question", "question", "''"),
    (7, with_(supporting_docs=["d999999"]), "support", "supporting_docs", "d999999"),
    (8, with_(hops=9), "hops", "hops", "9"),
    (9, with_(hops=0), "hops", "hops", "0"),
    (10, with_(hops="2"), "hops", "hops", "'2'"),
    (11, with_(source=None), "source", "source", "None"),
])
def test_qa_fault_is_reported_with_file_line_field(data_dir, line, change, check, field, value_has):
    path = data_dir / "qa" / "train.jsonl"
    edit_line(path, line, change)
    report = V.validate_qa_split(path, _ids(data_dir))
    f = assert_names(report, check, path, field, line=line, value_has=value_has)
    assert f["unexpected_count"] == 1 and "1 of 30 rows" in f["observed"]
    assert [x["check"] for x in report.failures] == [check]  # one fault, one failed expectation


def test_line_that_is_not_json_is_a_failure_not_a_crash(data_dir):
    path = data_dir / "qa" / "train.jsonl"
    edit_line(path, 12, lambda obj: '{"id": "train-x", "question": ')
    edit_line(path, 13, lambda obj: '["a", "list"]')
    report = V.validate_qa_split(path, {"unused"})  # also: every support id missing
    f = assert_names(report, "json", path, "(line)", line=12, value_has="not valid JSON")
    assert {r["line"] for r in f["rows"]} == {12, 13} and f["unexpected_count"] == 2
    assert "expected a JSON object, got list" in report.to_markdown()
    # the unparsed lines are not counted again by the per-field checks
    assert failure(report, "support")["unexpected_count"] == 28


def test_duplicate_ids_within_and_across_splits(data_dir):
    train, dev = data_dir / "qa" / "train.jsonl", data_dir / "qa" / "dev.jsonl"
    first = json.loads(train.read_text().splitlines()[1])["id"]
    edit_line(train, 20, with_(id=first))
    edit_line(dev, 4, with_(id=first))
    # The engine's schema check runs first and its problems are the report (splits are read
    # in name order: dev, test, train).
    reports = V.validate_dataset(data_dir)
    assert [r.suite for r in reports] == ["records"]
    rows = reports[0].failures[0]["rows"]
    assert [(r["file"], r["line"], r["field"]) for r in rows] == [(str(train), 2, "id"), (str(train), 20, "id")]
    assert "also in split 'dev'" in rows[0]["value"] and "first on line 2" in rows[1]["value"]
    assert f"{train}:20" in reports[0].to_markdown()
    # The GX suites, on the same faults, agree.
    f = assert_names(V.validate_qa_split(train, _ids(data_dir)), "id_unique", train, "id", line=20, value_has=first)
    assert {r["line"] for r in f["rows"]} == {2, 20}
    across = V.suite_reports(data_dir)[-1]
    assert across.suite == "qa_dataset"
    assert_names(across, "id_unique_across", dev, "id", line=4, value_has=first)


def test_corpus_empty_title_and_duplicate_id(data_dir):
    path = data_dir / "corpus.jsonl"
    dup = json.loads(path.read_text().splitlines()[0])["id"]
    edit_line(path, 5, with_(title=""))
    edit_line(path, 9, with_(id=dup))
    report = V.validate_corpus(path)
    assert_names(report, "title", path, "title", line=5, value_has="''")
    assert_names(report, "id_unique", path, "id", line=9, value_has=dup)
    with pytest.raises(V.ValidationFailed) as e:
        V.raise_on_failure([V.validate_qa_split(data_dir / "qa" / "dev.jsonl", set()), report])
    assert e.value.report.suite == "qa_split" and str(e.value) == e.value.report.to_markdown()


def test_missing_or_empty_files(tmp_path):
    report = V.validate_corpus(tmp_path / "nope.jsonl")
    assert not report.success and "no such file" in report.to_markdown()
    empty = tmp_path / "train.jsonl"
    empty.write_text("\n")
    assert failure(V.validate_qa_split(empty, set()), "has_rows")["observed"] == "observed 0"
    reports = V.validate_dataset(tmp_path)  # neither a corpus nor splits
    assert not reports[0].success and not reports[-1].success


def _breaking(rule) -> list[tuple[str, object]]:
    """(GX check name, a value that breaks it) for each check of one record rule."""
    if rule.kind == "text":
        return [(rule.name, "  "), (rule.name, "x" * (rule.limit + 1))]
    if rule.kind == "texts":
        return [(f"{rule.name}_list", "not a list"), (f"{rule.name}_items", ["ok", ""]),
                (f"{rule.name}_items", ["x" * (rule.limit + 1)])] + ([] if rule.allow_empty else [(f"{rule.name}_list", [])])
    return [(rule.name, rule.lo - 1), (rule.name, rule.hi + 1), (rule.name, True)]


@pytest.mark.parametrize("rule", R.QA_RULES, ids=lambda r: r.name)
def test_loaders_and_suites_keep_one_set_of_record_rules(data_dir, rule):
    """Every way of breaking a rule of records.QA_RULES is refused by the loader, naming the field,
    and fails the GX check built from the same rule, on the same line."""
    path = data_dir / "qa" / "train.jsonl"
    original = path.read_text()
    for check, value in _breaking(rule):
        path.write_text(original)
        edit_line(path, 3, with_(**{rule.name: value}))
        with pytest.raises(R.DataError) as e:
            R.QARecord.from_json(json.loads(path.read_text().splitlines()[2]), path, 3)
        assert e.value.field.split("[")[0] == rule.name, (check, value)
        report = V.validate_qa_split(path, _ids(data_dir))
        assert check in [x["check"] for x in report.failures], (check, value, report.failures)
        assert_names(report, check, path, rule.name, line=3)


def _ids(data_dir: Path) -> set[str]:
    return {json.loads(x)["id"] for x in (data_dir / "corpus.jsonl").read_text().splitlines()}


# ---------------------------------------------------------------- rollouts


def write_bad(path: Path, change) -> Path:
    """A batch written by pyarrow directly, after change(rows) edits the row dicts in place."""
    table = store.to_table(make_trajectories(), 0, {})
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return path


def test_clean_rollout_batch_passes(tmp_path):
    info = store.write_rollouts(make_trajectories(), tmp_path / "it0.parquet", 0, {"run_id": "r"})
    report = V.validate_rollouts(info.path, max_length=MAX_LENGTH)
    assert report.success, report.to_markdown()
    assert report.n_rows == 2 and report.n_checks == len(V.ROLLOUT_CHECKS)
    assert V.validate_rollouts(store.read_rollouts(info.path), max_length=MAX_LENGTH).success


def _set(row: int, **fields):
    def change(rows):
        rows[row].update(fields)
    return change


def _trim_mask(rows):
    rows[1]["action_mask"] = rows[1]["action_mask"][:-1]


@pytest.mark.parametrize("change, check, field, value_has", [
    (_trim_mask, "lengths", "token_ids/action_mask/rollout_logprobs", "action_mask=4"),
    (_set(1, rollout_logprobs=[0.0] * 6), "lengths", "token_ids/action_mask/rollout_logprobs", "rollout_logprobs=6"),
    (_set(1, action_mask=[0, 0, 0, 0, 0], turn_ends=[]), "has_action", "action_mask", "action tokens=0"),
    (_set(1, action_mask=[0, 0, 0, 1, 2]), "mask_values", "action_mask", "2"),
    (_set(1, action_mask=[1, 0, 0, 1, 1]), "prompt_masked", "action_mask", "prompt_len=3"),
    (_set(1, outcome_reward=float("nan")), "rewards_finite", "outcome_reward/process_rewards", "outcome=nan"),
    (_set(1, process_rewards=[float("inf")]), "rewards_finite", "outcome_reward/process_rewards", "process=[inf]"),
    (_set(1, outcome_reward=7.5), "outcome_bounds", "outcome_reward", "outcome=7.5"),
    (_set(1, process_rewards=[-4.0]), "process_low", "process_rewards", "process=[-4]"),
    (_set(1, process_rewards=[5.0]), "process_high", "process_rewards", "process=[5]"),
    (_set(1, process_rewards=[0.0, 0.0]), "turns", "process_rewards", "process_rewards=2"),
    (_set(1, turn_ends=[2]), "turn_ends", "turn_ends", "turn_ends=[2]"),
    (_set(1, rollout_logprobs=[0.0, 0.0, 0.0, float("nan"), 0.5]), "logprobs", "rollout_logprobs", "position 3: nan, position 4: 0.5"),
])
def test_rollout_fault_is_reported_with_file_row_field(tmp_path, change, check, field, value_has):
    path = write_bad(tmp_path / "bad.parquet", change)
    report = V.validate_rollouts(path, max_length=MAX_LENGTH)
    f = assert_names(report, check, path, field, row=1, value_has=value_has)
    assert f["rows"][0]["id"] == "train-00002" and f["unexpected_count"] == 1


def test_over_long_sequence(tmp_path):
    path = write_bad(tmp_path / "long.parquet", lambda rows: None)
    report = V.validate_rollouts(path, max_length=10)  # episode 0 has 12 tokens, episode 1 has 5
    assert_names(report, "max_length", path, "token_ids", row=0, value_has="token_ids=12")
    assert [f["check"] for f in report.failures] == ["max_length"]
    assert "<= 10" in report.to_markdown()


def test_reward_bounds_are_parameters(tmp_path):
    info = store.write_rollouts(make_trajectories(), tmp_path / "it.parquet", 0, {})
    report = V.validate_rollouts(info.path, max_length=MAX_LENGTH, reward_bounds=(0.0, 1.0))
    assert {f["check"] for f in report.failures} == {"outcome_bounds", "process_low"}  # 1.1 and -0.1


def test_unreadable_rollouts(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    assert "cannot read as Parquet" in V.validate_rollouts(junk, MAX_LENGTH).to_markdown()
    partial = pa.table({"record_id": ["a"]})
    report = V.validate_rollouts(partial, MAX_LENGTH)
    assert not report.success and "required columns missing" in report.to_markdown()
    empty = store.to_table([], 0, {})
    assert [f["check"] for f in V.validate_rollouts(empty, MAX_LENGTH).failures] == ["has_rows"]
