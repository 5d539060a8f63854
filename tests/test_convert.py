"""HotpotQA (both layouts) and MuSiQue converters, on the real samples in shared/realdata."""
from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from agentr1.config import DataSource
from agentr1.env.qa.convert import convert, doc_id
from agentr1.env.datasets import convert_to_dataset
from agentr1.data.records import DataError, load_dataset

REAL = Path(__file__).resolve().parents[2] / "shared" / "realdata" / "hipporag"
HOTPOT = REAL / "hotpotqa_train.json"
MUSIQUE = REAL / "musique_train.json"
needs_real = pytest.mark.skipif(not HOTPOT.is_file() or not MUSIQUE.is_file(), reason="shared/realdata not present")

HOTPOT_RECORD = {
    "_id": "h1",
    "question": "Which country is Kelmora in?",
    "answer": "Vostan",
    "type": "bridge",
    "level": "easy",
    "supporting_facts": [["Kelmora", 0], ["Vostan", 1]],
    "context": [
        ["Kelmora", ["Kelmora is a city.", " It lies in Vostan."]],
        ["Brim", ["Brim is a river."]],
        ["Vostan", ["Vostan is a country.", " Its capital is Tarsk."]],
    ],
}
MUSIQUE_RECORD = {
    "id": "3hop1__1_2_3",
    "question": "Q?",
    "answer": "A",
    "answer_aliases": ["Alias", "A"],
    "answerable": True,
    "paragraphs": [
        {"idx": 0, "title": "T0", "paragraph_text": "Text zero.", "is_supporting": True},
        {"idx": 1, "title": "T1", "paragraph_text": "Text one.", "is_supporting": False},
        {"idx": 2, "title": "T2", "paragraph_text": "Text two.", "is_supporting": True},
    ],
    "question_decomposition": [{"id": 1, "question": "a", "answer": "b", "paragraph_support_idx": 0}],
}


def to_hf_layout(record: dict) -> dict:
    """The Hugging Face `hotpot_qa` (distractor) layout of an original-layout record."""
    out = {k: v for k, v in record.items() if k not in ("_id", "supporting_facts", "context")}
    out["id"] = record["_id"]
    out["supporting_facts"] = {"title": [t for t, _ in record["supporting_facts"]],
                               "sent_id": [s for _, s in record["supporting_facts"]]}
    out["context"] = {"title": [t for t, _ in record["context"]], "sentences": [s for _, s in record["context"]]}
    return out


def _write(path: Path, records: list, lines: bool = False) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) if lines else json.dumps(records))
    return path


@needs_real
def test_real_hotpotqa_sample():
    records, corpus = convert("hotpotqa", HOTPOT)
    assert len(records) == 100 and len(corpus) == 994
    assert {r.hops for r in records} == {2} and {r.source for r in records} == {"hotpotqa"}
    assert Counter(r.meta["type"] for r in records) == {"bridge": 78, "comparison": 22}
    by_id = {d.id: d for d in corpus}
    for r in records:
        titles = {t for t, _ in r.meta["supporting_facts"]}
        assert {by_id[d].title for d in r.supporting_docs} == titles
    first = records[0]
    assert first.id == "5a77ec115542992a6e59dff7" and first.answers == ("a spirit",)
    assert [by_id[d].title for d in first.supporting_docs] == ["Alû", "Lilu (mythology)"]
    assert by_id[first.supporting_docs[0]].text.startswith("In Akkadian and Sumerian mythology, Alû")


@needs_real
def test_real_musique_sample():
    records, corpus = convert("musique", MUSIQUE)
    assert len(records) == 100 and len(corpus) == 1890
    assert Counter(r.hops for r in records) == {2: 68, 3: 27, 4: 5}
    assert Counter(r.meta["hop_type"] for r in records) == {"2hop": 68, "3hop1": 24, "3hop2": 3, "4hop1": 3, "4hop3": 2}
    assert all(2 <= len(r.supporting_docs) <= 4 for r in records)
    first = records[0]
    assert first.id == "2hop__150763_14904" and first.answers == ("G. Stanley Hall", "Stanley Hall")
    assert first.meta["question_decomposition"][0]["answer"] == "American Psychological Association"


@needs_real
def test_hf_layout_and_json_lines_give_the_same_result(tmp_path):
    originals = json.loads(HOTPOT.read_text())[:5]
    expected = convert("hotpotqa", _write(tmp_path / "orig.json", originals))
    assert convert("hotpotqa", _write(tmp_path / "hf.jsonl", [to_hf_layout(r) for r in originals], lines=True)) == expected
    assert convert("hotpotqa", _write(tmp_path / "hf.json", [to_hf_layout(r) for r in originals])) == expected
    assert convert("hotpotqa", _write(tmp_path / "orig.jsonl", originals, lines=True)) == expected


def test_hotpotqa_record_fields(tmp_path):
    records, corpus = convert("hotpotqa", _write(tmp_path / "h.json", [HOTPOT_RECORD]))
    assert [d.text for d in corpus] == ["Kelmora is a city. It lies in Vostan.", "Brim is a river.",
                                        "Vostan is a country. Its capital is Tarsk."]
    (r,) = records
    assert r.supporting_docs == (corpus[0].id, corpus[2].id)
    assert r.meta == {"supporting_facts": [["Kelmora", 0], ["Vostan", 1]], "type": "bridge", "level": "easy"}
    assert corpus[0].id == doc_id("Kelmora", corpus[0].text) and len(corpus[0].id) == 16


def test_paragraphs_are_pooled_once_with_stable_ids(tmp_path):
    second = copy.deepcopy(HOTPOT_RECORD) | {"_id": "h2"}
    second["context"][1] = ["Other", ["Something else."]]
    records, corpus = convert("hotpotqa", _write(tmp_path / "h.json", [HOTPOT_RECORD, second]))
    assert len(corpus) == 4 and records[0].supporting_docs == records[1].supporting_docs
    again = convert("hotpotqa", _write(tmp_path / "h2.json", [second]))[1]
    assert {d.id for d in again} <= {d.id for d in corpus}


def test_musique_record_fields(tmp_path):
    unanswerable = MUSIQUE_RECORD | {"id": "2hop__9_9", "answerable": False}
    no_prefix = MUSIQUE_RECORD | {"id": "odd_id"}
    records, corpus = convert("musique", _write(tmp_path / "m.jsonl", [MUSIQUE_RECORD, unanswerable, no_prefix], True))
    assert [r.id for r in records] == ["3hop1__1_2_3", "odd_id"]  # the unanswerable one is skipped
    assert records[0].answers == ("A", "Alias") and records[0].hops == 3
    assert records[1].hops == 1  # from the decomposition when the id has no prefix
    assert records[0].supporting_docs == (corpus[0].id, corpus[2].id) and len(corpus) == 3


@pytest.mark.parametrize(
    ("fmt", "record", "field", "needle"),
    [
        ("hotpotqa", {k: v for k, v in HOTPOT_RECORD.items() if k != "answer"}, "[1].answer", "missing"),
        ("hotpotqa", HOTPOT_RECORD | {"question": " "}, "[1].question", "empty"),
        ("hotpotqa", HOTPOT_RECORD | {"supporting_facts": [["Nowhere", 0]]}, "[1].supporting_facts[0]", "Nowhere"),
        ("hotpotqa", HOTPOT_RECORD | {"context": "text"}, "[1].context", "expected"),
        ("hotpotqa", HOTPOT_RECORD | {"context": {"title": ["a"]}}, "[1].context", "expected"),
        ("hotpotqa", HOTPOT_RECORD | {"_id": "h0"}, "[1].id", "duplicate"),
        ("musique", MUSIQUE_RECORD | {"answer_aliases": "A"}, "[1].answer_aliases", "list"),
        ("musique", MUSIQUE_RECORD | {"paragraphs": [{"title": "x"}]}, "[1].paragraphs[0].paragraph_text", "string"),
        # wrong types, hostile text and sizes: a DataError naming the input row, never a traceback
        ("hotpotqa", HOTPOT_RECORD | {"supporting_facts": [[["Kelmora"], 0]]}, "[1].supporting_facts[0]", "title string"),
        ("hotpotqa", HOTPOT_RECORD | {"supporting_facts": [["Kelmora", "0"]]}, "[1].supporting_facts[0]", "index"),
        ("hotpotqa", HOTPOT_RECORD | {"answer": "a\ud800"}, "[1].answer", "lone surrogate"),
        ("hotpotqa", HOTPOT_RECORD | {"question": "x" * 3000}, "[1].question", "more than the limit"),
        ("musique", MUSIQUE_RECORD | {"paragraphs": [{"title": None, "paragraph_text": "t", "is_supporting": True}]},
         "[1].paragraphs[0].title", "string"),
        ("musique", MUSIQUE_RECORD | {"paragraphs": [{"title": "T", "paragraph_text": "t", "is_supporting": 1}]},
         "[1].paragraphs[0].is_supporting", "true or false"),
        ("musique", MUSIQUE_RECORD | {"answerable": "false"}, "[1].answerable", "true or false"),
        ("musique", MUSIQUE_RECORD | {"id": "5hop__1_2_3_4_5"}, "[1].hops", "integer in [1, 4]"),
    ],
)
def test_bad_records_name_record_and_field(tmp_path, fmt, record, field, needle):
    good = (HOTPOT_RECORD | {"_id": "h0"}) if fmt == "hotpotqa" else (MUSIQUE_RECORD | {"id": "2hop__0"})
    path = _write(tmp_path / "in.json", [good, record])
    with pytest.raises(DataError) as info:
        convert(fmt, path)
    assert (info.value.path, info.value.field) == (str(path), field) and needle in info.value.message


def test_json_lines_errors_name_the_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(HOTPOT_RECORD) + "\n\n" + json.dumps(HOTPOT_RECORD | {"_id": "x", "answer": ""}) + "\n")
    with pytest.raises(DataError, match=r"in\.jsonl:3: field 'answer': empty"):
        convert("hotpotqa", path)
    path.write_text(json.dumps(HOTPOT_RECORD) + "\nnot json\n")
    with pytest.raises(DataError, match=r"in\.jsonl:2: not valid JSON"):
        convert("hotpotqa", path)


def test_unknown_format_and_empty_input(tmp_path):
    with pytest.raises(ValueError, match="unknown format"):
        convert("squad", _write(tmp_path / "x.json", [HOTPOT_RECORD]))
    with pytest.raises(DataError, match="no hotpotqa records"):
        convert("hotpotqa", _write(tmp_path / "empty.json", []))


@pytest.mark.parametrize("fmt", ["hotpotqa", "musique", "svamp", "mawps", "gsm8k"])
def test_a_file_format_without_a_file_names_the_input_field_and_writes_nothing(tmp_path, fmt):
    with pytest.raises(DataError, match=f"field 'input': format '{fmt}' converts a file") as caught:
        convert_to_dataset(DataSource(format=fmt, split="eval"), tmp_path / "ds")
    assert caught.value.path == "data.sources" and not (tmp_path / "ds").exists()


def test_convert_to_dataset_writes_a_loadable_split(tmp_path):
    source = DataSource(format="musique", input=str(_write(tmp_path / "m.json", [MUSIQUE_RECORD])), split="eval")
    summary = convert_to_dataset(source, tmp_path / "ds")
    assert summary["kind"] == "qa" and summary["splits"] == {"eval": 1} and summary["n_docs"] == 3
    splits, corpus = load_dataset(tmp_path / "ds")
    assert list(splits) == ["eval"] and splits["eval"][0].meta["hop_type"] == "3hop1" and len(corpus) == 3


@needs_real
def test_cli_convert_splits_train_dev_test_by_id_hash_as_the_pipeline_does(tmp_path, capsys):
    from cli.main import main
    from agentr1.data.splits import split_of

    args = ["data", "convert", "--format", "hotpotqa", "--input", str(HOTPOT)]
    assert main([*args, "--out", str(tmp_path / "ds"), "--test-fraction", "0.2", "--dev-fraction", "0.1"]) == 0
    counts = json.loads(capsys.readouterr().out)["splits"]
    splits, _ = load_dataset(tmp_path / "ds")
    assert set(splits) == {"train", "dev", "test"} and {k: len(v) for k, v in splits.items()} == counts
    assert all(split_of(r.id, 0.1, 0.2) == name for name, records in splits.items() for r in records)
    assert counts["train"] > counts["test"] > counts["dev"] > 0
    assert main([*args, "--out", str(tmp_path / "bad"), "--test-fraction", "0.7", "--dev-fraction", "0.5"]) == 2
    assert "dev + test < 1" in capsys.readouterr().err and not (tmp_path / "bad").exists()
