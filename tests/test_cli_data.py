"""The data and search commands, in-process through main() and once through the installed script."""
from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import build_parser, main
from agentr1.data.records import MARKER_FILE, DataError, load_dataset

from test_convert import HOTPOT_RECORD, MUSIQUE_RECORD

SMALL = ["--n-train", "30", "--n-dev", "5", "--n-test", "10"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "data"
    assert main(["data", "synth", "--out", str(out), "--seed", "5", *SMALL]) == 0
    return out


def test_parser_is_extensible():
    parser = build_parser()
    args = parser.parse_args(["data", "synth", "--out", "x", "--hop-weights", "1,1"])
    assert args.hop_weights == (1.0, 1.0) and callable(args.func)
    assert main([]) == 2  # a command is required
    assert main(["data", "synth", "--out", "x", "--hop-weights", "a,b"]) == 2


def test_synth_prints_stats_and_writes_a_valid_dataset(capsys, tmp_path):
    code, out, _ = _run(capsys, "data", "synth", "--out", tmp_path / "d", "--seed", "1", *SMALL, "--hop-weights", "0,1,1")
    stats = json.loads(out)
    assert code == 0 and stats["splits"]["train"] == {"n": 30, "hops": {"2": 15, "3": 15}}
    assert stats["n_docs"] > 30 and stats["majority_answer_em_test"] == 0.0 and stats["seconds"] >= 0
    splits, corpus = load_dataset(tmp_path / "d")
    assert {k: len(v) for k, v in splits.items()} == {"dev": 5, "test": 10, "train": 30}
    assert len(corpus) == stats["n_docs"]


def test_validate_retrieval_eval_and_search(capsys, synth_dir, tmp_path):
    code, out, _ = _run(capsys, "data", "validate", "--data", synth_dir)
    assert code == 0 and json.loads(out)["splits"] == {"dev": 5, "test": 10, "train": 30} and "note" not in json.loads(out)
    dev_only = Path(shutil.copytree(synth_dir, tmp_path / "dev-only"))
    for split in ("train", "test"):
        (dev_only / "qa" / f"{split}.jsonl").unlink()
    code, out, _ = _run(capsys, "data", "validate", "--data", dev_only)  # valid, but not for training: says so
    assert code == 0 and json.loads(out)["note"].startswith("no train, test split: `agentr1 train`")
    # --out (the DVC stage's): the report written whole; a bad dataset writes nothing there
    report = tmp_path / "out" / "validation.json"
    code, out, _ = _run(capsys, "data", "validate", "--data", synth_dir, "--out", report)
    assert code == 0 and json.loads(report.read_text()) == json.loads(out)
    (dev_only / "qa" / "dev.jsonl").write_text("{not json\n")
    code, _, _ = _run(capsys, "data", "validate", "--data", dev_only, "--out", tmp_path / "bad" / "validation.json")
    assert code == 2 and not (tmp_path / "bad").exists()

    code, out, _ = _run(capsys, "data", "retrieval-eval", "--data", synth_dir, "--split", "test", "--k", "5",
                        "--cache-dir", tmp_path / "cache")
    result = json.loads(out)
    assert code == 0 and set(result) == {"split", "k", "n", "any_support_at_k", "all_support_at_k",
                                         "mean_support_recall_at_k"}
    assert result["n"] == 10 and result["any_support_at_k"] >= result["mean_support_recall_at_k"] >= result["all_support_at_k"]
    assert result["any_support_at_k"] == 1.0  # the question names the first hop's entity

    record = load_dataset(synth_dir)[0]["test"][0]
    name = record.meta["chain"][0]["query"]
    code, out, _ = _run(capsys, "search", "--data", synth_dir, "--k", "2", name)
    hits = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and 1 <= len(hits) <= 2 and hits[0]["title"] == name and hits[0]["rank"] == 1
    assert hits[0]["doc_id"] == record.supporting_docs[0] and set(hits[0]) == {"rank", "doc_id", "title", "score", "text"}
    code, out, _ = _run(capsys, "search", "--data", synth_dir, "the of")
    assert code == 0 and out == ""


def test_convert_command(capsys, tmp_path):
    src = tmp_path / "m.json"
    src.write_text(json.dumps([MUSIQUE_RECORD]))
    code, out, _ = _run(capsys, "data", "convert", "--format", "musique", "--input", src, "--out", tmp_path / "ds")
    assert code == 0 and json.loads(out)["splits"] == {"dev": 1}
    assert list(load_dataset(tmp_path / "ds")[0]) == ["dev"]


def _without(record: dict, key: str) -> dict:
    return {k: v for k, v in record.items() if k != key}


@pytest.mark.parametrize(
    ("rows", "where"),
    [
        ([HOTPOT_RECORD, _without(HOTPOT_RECORD, "answer") | {"_id": "b"}], ":2: field 'answer': missing"),
        ([HOTPOT_RECORD, HOTPOT_RECORD | {"_id": "b", "question": ""}], ":2: field 'question': empty"),
        ([HOTPOT_RECORD | {"supporting_facts": [["Gone", 0]]}], ":1: field 'supporting_facts[0]'"),
        ([HOTPOT_RECORD, HOTPOT_RECORD], ":2: field 'id': duplicate"),
        (["{oops"], ":1: not valid JSON"),
    ],
)
def test_bad_input_exits_2_names_file_line_field_and_writes_nothing(capsys, tmp_path, rows, where):
    src = tmp_path / "in.jsonl"
    src.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    code, out, err = _run(capsys, "data", "convert", "--format", "hotpotqa", "--input", src, "--out", tmp_path / "out")
    assert code == 2 and out == ""
    assert f"{src}{where}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output dir, no temp dir


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda row: row.pop("answers"), "qa/test.jsonl:2: field 'answers': missing"),
        (lambda row: row.update(question=""), "qa/test.jsonl:2: field 'question': empty"),
        (lambda row: row.update(supporting_docs=["nope"]), "qa/test.jsonl:2: field 'supporting_docs[0]'"),
        (lambda row: row.update(id="test-00000"), "qa/test.jsonl:2: field 'id': duplicate"),
    ],
)
def test_bad_dataset_rows_are_reported_by_every_reader(capsys, synth_dir, tmp_path, edit, where):
    data = tmp_path / "data"
    shutil.copytree(synth_dir, data)
    path = data / "qa" / "test.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    edit(row)
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    for argv in (["data", "validate", "--data", data], ["data", "retrieval-eval", "--data", data, "--split", "test"]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and where in err, err
    # --traceback (before the command: `agentr1 pipeline -v` is another flag, third-party output)
    # shows what is behind the one line
    with pytest.raises(DataError, match=re.escape(where)):
        main(["--traceback", "data", "validate", "--data", str(data)])


def test_synth_replaces_only_a_dataset_it_made(capsys, synth_dir, tmp_path):
    ours = Path(shutil.copytree(synth_dir, tmp_path / "ours"))
    code, _, _ = _run(capsys, "data", "synth", "--out", ours, "--seed", "6", *SMALL)
    assert code == 0 and (ours / MARKER_FILE).is_file()
    assert (ours / "qa" / "test.jsonl").read_bytes() != (synth_dir / "qa" / "test.jsonl").read_bytes()
    theirs = Path(shutil.copytree(synth_dir, tmp_path / "theirs"))
    (theirs / MARKER_FILE).unlink()
    before = {p: p.read_bytes() for p in theirs.rglob("*") if p.is_file()}
    for argv in (["data", "synth", "--out", theirs, *SMALL],
                 ["data", "convert", "--format", "hotpotqa", "--input", tmp_path / "unused.json", "--out", theirs]):
        (tmp_path / "unused.json").write_text(json.dumps([HOTPOT_RECORD]))
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and f"{theirs}: exists and was not generated by agentr1 (no {MARKER_FILE})" in err
    assert {p: p.read_bytes() for p in theirs.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (json.dumps(HOTPOT_RECORD).encode() + b'\n{"_id": "caf\xe9"}\n', ":2: not UTF-8 text"),
        (json.dumps([MUSIQUE_RECORD | {"paragraphs": [{"title": " ", "paragraph_text": "t", "is_supporting": True}]}])
         .encode(), ": field '[0].paragraphs[0].title': missing or empty"),
    ],
)
def test_convert_refuses_undecodable_or_untitled_input(capsys, tmp_path, raw, where):
    src = tmp_path / "in.json"
    src.write_bytes(raw)
    fmt = "musique" if b"paragraphs" in raw else "hotpotqa"
    code, out, err = _run(capsys, "data", "convert", "--format", fmt, "--input", src, "--out", tmp_path / "out")
    assert code == 2 and out == "" and f"{src}{where}" in err, err
    assert not (tmp_path / "out").exists()


def test_installed_script_is_deterministic_across_processes(tmp_path, synth_dir):
    """The console script, in a fresh interpreter with another hash seed, writes the same bytes."""
    script = shutil.which("agentr1", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert script is not None
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = tmp_path / "again"
    done = subprocess.run([script, "data", "synth", "--out", str(out), "--seed", "5", *SMALL],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n_docs"] > 0
    for name in ("corpus.jsonl", "qa/train.jsonl", "qa/dev.jsonl", "qa/test.jsonl"):
        assert (out / name).read_bytes() == (synth_dir / name).read_bytes(), name
    bad = subprocess.run([script, "data", "validate", "--data", str(tmp_path / "missing")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "missing: no such dataset directory" in bad.stderr


def test_a_plugins_kind_is_generated_and_validated_by_its_own_rules(tmp_path, capsys):
    """data synth / validate know any registered kind: a plug-in's (its generator, its rules)."""
    units = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "units.py")
    out = tmp_path / "units"
    code, printed, err = _run(capsys, "data", "synth", "--out", out, "--kind", "units", "--plugin", units, *SMALL)
    assert code == 0, err
    assert json.loads(printed)["splits"] == {"train": 30, "dev": 5, "test": 10}
    assert json.loads((out / "qa" / "train.jsonl").read_text().splitlines()[0])["calls"][0]["name"] == "convert"
    code, printed, err = _run(capsys, "data", "validate", "--data", out, "--kind", "units", "--plugin", units)
    assert code == 0 and json.loads(printed)["kind"] == "units", err
    # The sql environment's rules are not the units records': named by file, line and field.
    code, _, err = _run(capsys, "data", "validate", "--data", out, "--kind", "sql")
    assert code == 2 and f"{out / 'qa' / 'train.jsonl'}:1: field 'gold_values': env.kind 'sql' needs:" in err
    # A kind no plug-in registered (not 'shop': another test of this process may have loaded its plug-in).
    code, _, err = _run(capsys, "data", "synth", "--out", tmp_path / "x", "--kind", "no-such-kind")
    assert code == 2 and "env.kind: unknown environment 'no-such-kind'" in err and not (tmp_path / "x").exists()
