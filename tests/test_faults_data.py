"""Bad data through every entry point: one verdict, naming file, line and field, and no writes.

Each fault kind in ``FAULTS`` is applied to a copy of a small valid dataset that carries no
generator marker (a user's data, which nothing may regenerate). Then

- ``agentr1 data validate`` (also the DVC validate stage's command) exits 2,
- ``agentr1 train`` (conf/train.yaml pointed at it) exits 2 with the same message and does
  not create its output directory,
- the pipeline's data step (``tasks.data.dataset_reports``: what ``prepare_data`` checks
  before it versions anything) fails with the same problems, and
- the Great Expectations suites alone, whose limits come from the same schema, fail too.

One real ``agentr1 pipeline`` run on a bad dataset inside a DVC repository checks that no
``.dvc`` file, no DVC cache entry, no run directory and no registered version appear.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from cli.main import main
from agentr1.config import load_config
from agentr1.data.generated import write_dataset
from agentr1.data.records import (MARKER_FILE, MAX_FIELD_CHARS, MAX_HOPS, MAX_LINE_BYTES, DataErrors, check_dataset,
                                  raise_errors)
from agentr1.env.qa.synth import generate
from adapters import validation as V
from tasks.data import dataset_reports
from agentr1.presets import DataSource

CONFIG = "conf/train.yaml"


# ---------------------------------------------------------------- the faults


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _set_line(path: Path, line: int, raw: bytes) -> None:
    lines = _lines(path)
    lines[line - 1] = raw
    path.write_bytes(b"\n".join(lines) + b"\n")


def _edit(file: str, line: int, change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        path = d / file
        _set_line(path, line, json.dumps(change(json.loads(_lines(path)[line - 1]))).encode())
    return apply


def _raw(file: str, line: int, raw: bytes) -> Callable[[Path], None]:
    return lambda d: _set_line(d / file, line, raw)


def _with(**fields) -> Callable[[dict], dict]:
    return lambda obj: {**obj, **fields}


def _without(key: str) -> Callable[[dict], dict]:
    return lambda obj: {k: v for k, v in obj.items() if k != key}


def _id_of(d: Path, file: str, line: int) -> str:
    return json.loads(_lines(d / file)[line - 1])["id"]


def _copy_id(src: str, src_line: int, dst: str, dst_line: int) -> Callable[[Path], None]:
    return lambda d: _edit(dst, dst_line, _with(id=_id_of(d, src, src_line)))(d)


def _empty(file: str) -> Callable[[Path], None]:
    return lambda d: (d / file).write_text("\n")


TRAIN, DEV, CORPUS = "qa/train.jsonl", "qa/dev.jsonl", "corpus.jsonl"

# name -> (fault, what the first problem's message starts with, relative to the dataset dir).
# Splits are read in name order (dev, test, train) after the corpus.
FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "invalid_json": (_raw(TRAIN, 3, b'{"id": "x", "question": '), f"{TRAIN}:3: not valid JSON"),
    "non_utf8": (_raw(TRAIN, 3, b'{"id": "caf\xe9"}'), f"{TRAIN}:3: not UTF-8 text"),
    "not_an_object": (_raw(TRAIN, 3, b'["a", "list"]'), f"{TRAIN}:3: expected a JSON object, got list"),
    "line_over_size_limit": (_edit(TRAIN, 3, _with(question="x" * MAX_LINE_BYTES)), f"{TRAIN}:3: line of "),
    "question_over_size_limit": (_edit(TRAIN, 3, _with(question="x" * (MAX_FIELD_CHARS["question"] + 1))),
                                 f"{TRAIN}:3: field 'question': {MAX_FIELD_CHARS['question'] + 1} characters"),
    "missing_field": (_edit(TRAIN, 3, _without("answers")), f"{TRAIN}:3: field 'answers': missing"),
    "wrong_type_question": (_edit(TRAIN, 3, _with(question=7)), f"{TRAIN}:3: field 'question': expected a string"),
    "empty_question": (_edit(TRAIN, 3, _with(question="  ")), f"{TRAIN}:3: field 'question': empty"),
    "empty_answers": (_edit(TRAIN, 3, _with(answers=[])), f"{TRAIN}:3: field 'answers': empty list"),
    "empty_answer_string": (_edit(TRAIN, 3, _with(answers=["ok", ""])), f"{TRAIN}:3: field 'answers[1]'"),
    "answers_not_a_list": (_edit(TRAIN, 3, _with(answers="ok")), f"{TRAIN}:3: field 'answers': expected a list"),
    "hops_zero": (_edit(TRAIN, 3, _with(hops=0)), f"{TRAIN}:3: field 'hops': expected an integer in [1, {MAX_HOPS}]"),
    "hops_seven": (_edit(TRAIN, 3, _with(hops=7)), f"{TRAIN}:3: field 'hops': expected an integer in [1, {MAX_HOPS}]"),
    "hops_a_string": (_edit(TRAIN, 3, _with(hops="2")), f"{TRAIN}:3: field 'hops'"),
    "hops_a_bool": (_edit(TRAIN, 3, _with(hops=True)), f"{TRAIN}:3: field 'hops'"),
    "empty_source": (_edit(TRAIN, 3, _with(source="")), f"{TRAIN}:3: field 'source': empty"),
    "empty_id": (_edit(TRAIN, 3, _with(id="")), f"{TRAIN}:3: field 'id': empty"),
    "duplicate_id_in_split": (_copy_id(TRAIN, 1, TRAIN, 3), f"{TRAIN}:3: field 'id': duplicate record id"),
    "duplicate_id_across_splits": (_copy_id(TRAIN, 1, DEV, 2),
                                   f"{TRAIN}:1: field 'id': duplicate record id"),
    "unknown_supporting_doc": (_edit(TRAIN, 3, _with(supporting_docs=["no-such-doc"])),
                               f"{TRAIN}:3: field 'supporting_docs[0]': doc id 'no-such-doc' is not in the corpus"),
    "supporting_docs_not_a_list": (_edit(TRAIN, 3, _with(supporting_docs="d1")),
                                   f"{TRAIN}:3: field 'supporting_docs': expected a list"),
    "corpus_empty_title": (_edit(CORPUS, 2, _with(title="")), f"{CORPUS}:2: field 'title': empty"),
    "corpus_empty_text": (_edit(CORPUS, 2, _with(text=" ")), f"{CORPUS}:2: field 'text': empty"),
    "corpus_text_wrong_type": (_edit(CORPUS, 2, _with(text=5)), f"{CORPUS}:2: field 'text': expected a string"),
    "corpus_duplicate_id": (_copy_id(CORPUS, 1, CORPUS, 3), f"{CORPUS}:3: field 'id': duplicate document id"),
    "corpus_not_an_object": (_raw(CORPUS, 2, b'"text"'), f"{CORPUS}:2: expected a JSON object, got str"),
    "corpus_lone_surrogate": (_edit(CORPUS, 2, _with(text="a film \ud800 directed by")),
                              f"{CORPUS}:2: field 'text': holds a lone surrogate"),
    "question_lone_surrogate": (_edit(TRAIN, 3, _with(question="Who \udfff founded it?")),
                                f"{TRAIN}:3: field 'question': holds a lone surrogate"),
    "empty_dev_split": (_empty(DEV), f"{DEV}: no records (the file is empty)"),
    "empty_corpus": (_empty(CORPUS), f"{CORPUS}: no documents (the file is empty)"),
    "missing_corpus": (lambda d: (d / CORPUS).unlink(), f"{CORPUS}: missing"),
    "missing_splits": (lambda d: shutil.rmtree(d / "qa"), "qa: no QA splits"),
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    splits, corpus = generate(0, n_train=12, n_dev=4, n_test=4)
    out = tmp_path_factory.mktemp("clean") / "data"
    write_dataset(out, splits, corpus)
    (out / MARKER_FILE).unlink()  # a user's dataset: nothing may regenerate it
    return out


def _bad_copy(clean: Path, tmp_path: Path, fault: str) -> Path:
    data = Path(shutil.copytree(clean, tmp_path / "data"))
    FAULTS[fault][0](data)
    return data


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _error_text(err: str) -> str:
    """The ``agentr1: error: ...`` part of stderr (training may log lines before it)."""
    assert "agentr1: error: " in err, err
    return err[err.index("agentr1: error: "):]


def _expected(errors) -> str:
    """What the CLI prints for these problems (the one error, or all of them)."""
    return f"agentr1: error: {errors[0] if len(errors) == 1 else DataErrors(errors)}\n"


# ---------------------------------------------------------------- the same verdict everywhere


def test_at_least_22_fault_kinds():
    assert len(FAULTS) >= 22


def test_clean_dataset_passes_every_entry_point(clean, tmp_path, capsys):
    from agentr1.recipe.workspace import Workspace

    assert check_dataset(clean) == []
    code, out, _ = _cli(capsys, "data", "validate", "--data", clean)
    assert code == 0 and json.loads(out)["splits"] == {"dev": 4, "test": 4, "train": 12}
    cfg = load_config(CONFIG, [f"data.dir={clean}", f"output_dir={tmp_path / 'run'}"])
    assert sorted(Workspace.build(cfg).splits) == ["dev", "test", "train"]  # the training loader
    reports = dataset_reports(cfg, DataSource(version=False))
    assert [r.suite for r in reports] == ["corpus", "qa_split", "qa_split", "qa_split", "qa_dataset", "env_qa"]
    assert all(r.success for r in reports), V.summary_markdown(reports)
    assert sorted(p.name for p in clean.iterdir()) == ["corpus.jsonl", "qa"]  # nothing was generated


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_entry_point_refuses_with_the_same_message(clean, tmp_path, capsys, fault):
    data = _bad_copy(clean, tmp_path, fault)
    errors = check_dataset(data)
    assert errors, f"{fault}: the schema check passed"
    assert str(errors[0]).startswith(f"{data}/{FAULTS[fault][1]}"), str(errors[0])
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    code, out, err = _cli(capsys, "data", "validate", "--data", data)
    assert (code, out, err) == (2, "", _expected(errors))

    run_dir = tmp_path / "run"
    code, out, err = _cli(capsys, "train", "--config", CONFIG, "-o", f"data.dir={data}", "-o", f"output_dir={run_dir}")
    assert (code, out, _error_text(err)) == (2, "", _expected(errors))
    assert not run_dir.exists()

    cfg = load_config(CONFIG, [f"data.dir={data}", f"output_dir={run_dir}"])
    reports = dataset_reports(cfg, DataSource(version=False))
    assert [r.suite for r in reports] == ["records"] and not reports[0].success
    rows = reports[0].failures[0]["rows"]
    assert [(r["file"], r["line"], r["field"], r["value"]) for r in rows] == [
        (e.path, e.line or 0, e.field or "", e.message) for e in errors]
    assert str(errors[0]).split(": ", 1)[0] in reports[0].to_markdown()

    # The GX suites, built from the same limits, agree on their own.
    assert not all(r.success for r in V.suite_reports(data)), f"{fault}: the GX suites passed"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_many_problems_are_listed_up_to_the_bound(clean, tmp_path, capsys):
    data = _bad_copy(clean, tmp_path, "empty_corpus")  # every supporting doc is now unknown too
    errors = check_dataset(data)
    assert len(errors) > 1 and str(errors[0]) == f"{data}/{CORPUS}: no documents (the file is empty)"
    code, _, err = _cli(capsys, "data", "validate", "--data", data)
    assert code == 2 and err.splitlines()[1:len(errors)] == [str(e) for e in errors[1:]]
    with pytest.raises(DataErrors):
        raise_errors(errors)


def test_a_users_incomplete_directory_is_not_regenerated(clean, tmp_path, capsys):
    """The old behaviour replaced a data dir without corpus.jsonl by a synthetic world."""
    data = _bad_copy(clean, tmp_path, "missing_corpus")
    (data / "notes.txt").write_text("mine")
    code, _, err = _cli(capsys, "train", "--config", CONFIG, "-o", f"data.dir={data}", "-o",
                        f"output_dir={tmp_path / 'run'}")
    assert code == 2 and "corpus.jsonl: missing" in err and "never into this one" in err
    code, _, err = _cli(capsys, "data", "synth", "--out", data, "--n-train", "5", "--n-dev", "1", "--n-test", "1")
    assert code == 2 and f"no {MARKER_FILE}" in err
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt", "qa"] and (data / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- the real pipeline, once


@pytest.mark.slow  # ~20 s: a pipeline run up to its data checks, and its Prefect server
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inside DVC and Prefect
def test_pipeline_refuses_bad_data_before_dvc_records_it(clean, tmp_path, capsys, prefect_api):
    import mlflow

    from adapters import tracking

    repo = tmp_path / "repo"
    data = _bad_copy(clean, repo, "hops_seven")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True, timeout=120)
    cache_before = sorted((repo / ".dvc").rglob("*"))
    client = mlflow.MlflowClient()
    versions = len(client.search_model_versions(f"name='{tracking.MODEL_NAME}'"))
    code, out, err = _cli(capsys, "pipeline", "-o", f"data.dir={data}", "--output-dir", tmp_path / "run")
    assert code == 2 and "validation failed, nothing was trained or registered" in err
    assert f"{data}/{TRAIN}:3" in err and "hops" in err
    assert not (repo / "data.dvc").exists() and sorted((repo / ".dvc").rglob("*")) == cache_before
    assert not (tmp_path / "run").exists()
    assert len(client.search_model_versions(f"name='{tracking.MODEL_NAME}'")) == versions
