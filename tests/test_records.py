"""Record formats: round trips, and every bad row rejected with file, line and field."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from agentr1.data.generated import generation_needed, missing_parts, write_dataset
from agentr1.data.records import (MARKER_FILE, MAX_ERRORS, MAX_FIELD_CHARS, MAX_HOPS, MAX_LINE_BYTES, DataError,
                                  DataErrors, Document, QARecord, check_dataset, corpus_digest, load_corpus,
                                  load_corpus_dir, load_dataset, load_qa, load_split)

DOCS = [Document("d1", "Kelmora", "Kelmora is a city in Vostan."), Document("d2", "Vostan", "Vostan is a country.")]


def _record(rid: str = "q1", **overrides) -> QARecord:
    fields = dict(id=rid, question="Where is Kelmora?", answers=("Vostan",), supporting_docs=("d1",), hops=1,
                  source="test", meta={"kind": "city>country", "chain": [{"query": "Kelmora"}]})
    fields.update(overrides)
    return QARecord(**fields)


def _row(**overrides) -> dict:
    row = _record().to_json()
    row.update(overrides)
    return {k: v for k, v in row.items() if v is not _DROP}


_DROP = object()


def _write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_round_trip_keeps_meta_and_key_order(tmp_path):
    records = [_record("q1"), _record("q2", hops=2, meta={"z": 1, "a": [1, 2]})]
    write_dataset(tmp_path / "ds", {"train": records[:1], "test": records[1:]}, DOCS)
    assert load_split(tmp_path / "ds", "train") == records[:1]
    loaded = load_split(tmp_path / "ds", "test")[0]
    assert loaded.meta == {"z": 1, "a": [1, 2]}
    first_line = (tmp_path / "ds" / "qa" / "test.jsonl").read_text().splitlines()[0]
    assert list(json.loads(first_line)) == ["id", "question", "answers", "supporting_docs", "hops", "source", "z", "a"]
    assert load_corpus_dir(tmp_path / "ds") == DOCS
    splits, corpus = load_dataset(tmp_path / "ds")
    assert sorted(splits) == ["test", "train"] and corpus == DOCS


def test_write_is_deterministic_and_digest_tracks_content(tmp_path):
    write_dataset(tmp_path / "a", {"dev": [_record()]}, DOCS)
    write_dataset(tmp_path / "b", {"dev": [_record()]}, DOCS)
    for name in ("corpus.jsonl", "qa/dev.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert corpus_digest(DOCS) == corpus_digest(list(DOCS))
    assert corpus_digest(DOCS) != corpus_digest(DOCS[:1])


def test_unicode_is_written_as_text(tmp_path):
    docs = [Document("d1", "Alû", "Alû is a demon.")]
    write_dataset(tmp_path / "ds", {"dev": [_record(supporting_docs=())]}, docs)
    assert "Alû" in (tmp_path / "ds" / "corpus.jsonl").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("row", "field", "needle"),
    [
        (_row(answers=_DROP), "answers", "missing"),
        (_row(answers=[]), "answers", "empty"),
        (_row(answers="Vostan"), "answers", "list"),
        (_row(answers=["Vostan", ""]), "answers[1]", "non-empty"),
        (_row(question=_DROP), "question", "missing"),
        (_row(question="   "), "question", "empty"),
        (_row(question=7), "question", "string"),
        (_row(hops="2"), "hops", "integer in [1, 4]"),
        (_row(hops=True), "hops", "integer in [1, 4]"),
        (_row(hops=0), "hops", "integer in [1, 4]"),
        (_row(hops=MAX_HOPS + 1), "hops", "integer in [1, 4]"),
        (_row(question="x" * (MAX_FIELD_CHARS["question"] + 1)), "question", "more than the limit"),
        (_row(answers=["ok", "y" * (MAX_FIELD_CHARS["answers"] + 1)]), "answers[1]", "more than the limit"),
        (_row(supporting_docs=[3]), "supporting_docs[0]", "non-empty string"),
        (_row(source=_DROP), "source", "missing"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, row, field, needle):
    path = _write_lines(tmp_path / "qa.jsonl", [_row(id="ok"), "", row])
    with pytest.raises(DataError) as info:
        load_qa(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert needle in err.message
    assert str(err).startswith(f"{path}:3: field '{field}': ")


def test_not_json_and_not_an_object(tmp_path):
    path = _write_lines(tmp_path / "qa.jsonl", [_row(), "{not json"])
    with pytest.raises(DataError, match=r"qa\.jsonl:2: not valid JSON"):
        load_qa(path)
    # the column is the line's: where a line cut short ends, not column 1 of the next line
    cut = json.dumps(_row())[:40]
    path = _write_lines(tmp_path / "cut.jsonl", [cut, _row(id="q2")])
    with pytest.raises(DataError, match=rf"cut\.jsonl:1: not valid JSON \(.* at column {len(cut) + 1}\)"):
        load_qa(path)
    path = _write_lines(tmp_path / "mid.jsonl", ['{"id": "q1", oops}'])
    with pytest.raises(DataError, match=r"at column 14\)"):
        load_qa(path)
    path = _write_lines(tmp_path / "list.jsonl", [[1, 2]])
    with pytest.raises(DataError, match=r"list\.jsonl:1: expected a JSON object"):
        load_qa(path)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        load_qa(tmp_path / "nope.jsonl")


def test_duplicate_ids_name_both_lines(tmp_path):
    path = _write_lines(tmp_path / "qa.jsonl", [_row(id="a"), _row(id="b"), _row(id="a")])
    with pytest.raises(DataError) as info:
        load_qa(path)
    assert (info.value.line, info.value.field) == (3, "id") and "first on line 1" in info.value.message
    corpus = _write_lines(tmp_path / "corpus.jsonl", [d.to_json() for d in DOCS + DOCS[:1]])
    with pytest.raises(DataError, match=r"corpus\.jsonl:3: field 'id': duplicate document id 'd1'"):
        load_corpus(corpus)


def test_bad_corpus_rows(tmp_path):
    path = _write_lines(tmp_path / "corpus.jsonl", [{"id": "d1", "title": "T", "text": ""}])
    with pytest.raises(DataError, match=r"corpus\.jsonl:1: field 'text': empty"):
        load_corpus(path)
    path = _write_lines(tmp_path / "corpus.jsonl", [{"id": "d1", "title": " ", "text": "t"}])
    with pytest.raises(DataError, match=r"corpus\.jsonl:1: field 'title': empty"):
        load_corpus(path)


def test_supporting_doc_missing_from_corpus_on_load(tmp_path):
    write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS)
    qa = tmp_path / "ds" / "qa" / "dev.jsonl"
    _write_lines(qa, [_row(id="a"), _row(id="b", supporting_docs=["d1", "d9"])])
    for load in (lambda: load_split(tmp_path / "ds", "dev"), lambda: load_dataset(tmp_path / "ds")):
        with pytest.raises(DataError) as info:
            load()
        assert (info.value.path, info.value.line, info.value.field) == (str(qa), 2, "supporting_docs[1]")
        assert "'d9'" in info.value.message


def test_duplicate_ids_across_splits_on_load(tmp_path):
    write_dataset(tmp_path / "ds", {"dev": [_record("a")], "test": [_record("b")]}, DOCS)
    _write_lines(tmp_path / "ds" / "qa" / "test.jsonl", [_row(id="a")])
    with pytest.raises(DataError, match=r"test\.jsonl:1: field 'id': duplicate record id 'a' \(also in split 'dev'\)"):
        load_dataset(tmp_path / "ds")


def _no_leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


@pytest.mark.parametrize(
    ("splits", "corpus", "pattern"),
    [
        ({"dev": [_record(supporting_docs=("d1", "d7"))]}, DOCS, r"dev\.jsonl:1: field 'supporting_docs\[1\]'"),
        ({"dev": [_record("a"), _record("a")]}, DOCS, r"dev\.jsonl:2: field 'id': duplicate"),
        ({"dev": [_record("a")], "test": [_record("a")]}, DOCS, r"test\.jsonl:1: field 'id'"),
        ({"dev": [_record(answers=())]}, DOCS, r"dev\.jsonl:1: field 'answers': empty"),
        ({"dev": [_record(question="")]}, DOCS, r"dev\.jsonl:1: field 'question': empty"),
        ({"dev": [_record()]}, DOCS + DOCS[:1], r"corpus\.jsonl:3: field 'id'"),
        ({"../x": [_record()]}, DOCS, r"bad split name"),
        ({"dev": [_record()]}, [], r"corpus\.jsonl: no documents"),
        ({"dev": []}, DOCS, r"dev\.jsonl: no records"),
        ({}, DOCS, r"no QA splits"),
    ],
)
def test_write_rejects_bad_data_without_output(tmp_path, splits, corpus, pattern):
    with pytest.raises(DataError, match=pattern):
        write_dataset(tmp_path / "out", splits, corpus)
    assert _no_leftovers(tmp_path) == []


def test_write_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    import agentr1.fsutil as fsutil

    def explode(new, target):
        raise OSError("disk full")

    monkeypatch.setattr(fsutil, "replace_dir", explode)
    with pytest.raises(OSError):
        write_dataset(tmp_path / "out", {"dev": [_record()]}, DOCS)
    assert _no_leftovers(tmp_path) == []


def test_overwrite_replaces_only_what_the_generator_made(tmp_path):
    write_dataset(tmp_path / "ds", {"dev": [_record("old")]}, DOCS)
    marker = json.loads((tmp_path / "ds" / MARKER_FILE).read_text())
    assert marker == {"generator": "agentr1", "files": ["corpus.jsonl", "qa/dev.jsonl"],
                      "sha256": {f: hashlib.sha256((tmp_path / "ds" / f).read_bytes()).hexdigest()
                                 for f in ("corpus.jsonl", "qa/dev.jsonl")}}
    write_dataset(tmp_path / "ds", {"test": [_record("new")]}, DOCS)
    assert not (tmp_path / "ds" / "qa" / "dev.jsonl").exists()
    assert [r.id for r in load_split(tmp_path / "ds", "test")] == ["new"]
    assert _no_leftovers(tmp_path) == ["ds"]
    with pytest.raises(DataError, match="exists: not replaced"):
        write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS, overwrite=False)


@pytest.mark.parametrize("make", [
    lambda d: (d / "notes.txt").write_text("keep me"),               # a user's directory
    lambda d: None,                                                   # an empty one: not ours either
    lambda d: (d / "qa").mkdir() or (d / "qa" / "dev.jsonl").write_text("keep me"),  # a dataset without a corpus
])
def test_write_never_replaces_a_directory_it_did_not_make(tmp_path, make):
    target = tmp_path / "home"
    target.mkdir()
    make(target)
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    with pytest.raises(DataError, match=f"not generated by agentr1 \\(no {MARKER_FILE}\\): not replaced"):
        write_dataset(target, {"dev": [_record()]}, DOCS)
    assert {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert _no_leftovers(tmp_path) == ["home"]


def test_write_keeps_a_marked_dataset_that_holds_a_users_file(tmp_path):
    write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS)
    (tmp_path / "ds" / "qa" / "mine.jsonl").write_text("my own split\n")
    with pytest.raises(DataError, match=r"holds files agentr1 did not write \(qa/mine\.jsonl\)"):
        write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS)
    assert (tmp_path / "ds" / "qa" / "mine.jsonl").read_text() == "my own split\n"


@pytest.mark.parametrize("make, shown", [
    (lambda d, mine: (d / "link").symlink_to(mine, target_is_directory=True), "link"),  # a link to a user's folder
    (lambda d, mine: (d / "empty").mkdir(), "empty"),                                 # a user's (empty) folder
    (lambda d, mine: (d / "qa" / "later").mkdir(), "qa/later"),
])
def test_write_keeps_a_marked_dataset_that_holds_a_users_folder_or_link(tmp_path, make, shown):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS)
    make(tmp_path / "ds", mine)
    with pytest.raises(DataError, match=rf"holds files agentr1 did not write \({shown}\)"):
        write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS)
    assert (tmp_path / "ds" / shown).exists() and (mine / "thesis.tex").read_text() == "keep me"


def test_a_generated_file_the_user_edited_is_never_regenerated_over(tmp_path):
    """The marker keeps each file's digest: a dataset the generator made whose corpus went missing
    while its train split was edited is refused, naming the edited file, and the edit stays."""
    write_dataset(tmp_path / "ds", {"train": [_record("a")], "dev": [_record("b")]}, DOCS)
    train = tmp_path / "ds" / "qa" / "train.jsonl"
    train.write_text(train.read_text().replace('"a"', '"mine"'))
    (tmp_path / "ds" / "corpus.jsonl").unlink()
    assert generation_needed(tmp_path / "ds")  # incomplete and ours: the generator may run...
    with pytest.raises(DataError, match=r"qa/train\.jsonl: changed since agentr1 generated it.*restore corpus\.jsonl"):
        write_dataset(tmp_path / "ds", {"train": [_record("a")], "dev": [_record("b")]}, DOCS)  # ...but not over it
    assert '"mine"' in train.read_text()
    # Unedited, the same incomplete dataset is regenerated.
    write_dataset(tmp_path / "clean", {"dev": [_record("b")]}, DOCS)
    (tmp_path / "clean" / "corpus.jsonl").unlink()
    write_dataset(tmp_path / "clean", {"dev": [_record("b")]}, DOCS)
    assert (tmp_path / "clean" / "corpus.jsonl").is_file()


def test_generation_needed(tmp_path):
    assert generation_needed(tmp_path / "absent")
    write_dataset(tmp_path / "ours", {"dev": [_record()]}, DOCS)
    assert not generation_needed(tmp_path / "ours")  # complete: loaded, not regenerated
    (tmp_path / "ours" / "corpus.jsonl").unlink()
    assert missing_parts(tmp_path / "ours") == ["corpus.jsonl"]
    assert generation_needed(tmp_path / "ours")  # incomplete, but ours: made again
    theirs = tmp_path / "theirs"
    (theirs / "qa").mkdir(parents=True)
    (theirs / "qa" / "train.jsonl").write_text(json.dumps(_row()) + "\n")
    assert missing_parts(theirs) == ["corpus.jsonl"]
    assert not generation_needed(theirs)  # incomplete and not ours: the loaders say what is missing
    with pytest.raises(DataError, match=r"theirs/corpus\.jsonl: missing .*never into this one"):
        load_dataset(theirs)
    (tmp_path / "file").write_text("x")
    assert not generation_needed(tmp_path / "file")
    with pytest.raises(DataError, match="file: not a directory"):
        load_dataset(tmp_path / "file")


# ---------------------------------------------------------------- bytes that are not records


def test_non_utf8_and_oversized_lines_name_file_and_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    huge = json.dumps(_row(id="big", question="x" * (MAX_LINE_BYTES + 10)))
    path.write_bytes(b"\n".join([json.dumps(_row(id="a")).encode(), b'{"id": "\xff\xfe"}', huge.encode(),
                                 json.dumps(_row(id="b")).encode()]) + b"\n")
    with pytest.raises(DataErrors) as info:
        load_qa(path)
    errors = info.value.errors
    assert [(e.line, e.field) for e in errors] == [(2, None), (3, None)]
    assert "not UTF-8 text (invalid start byte at byte 9 of the line)" in errors[0].message
    assert f"over the limit of {MAX_LINE_BYTES} bytes" in errors[1].message
    assert str(info.value).splitlines() == [str(e) for e in errors]
    assert (info.value.path, info.value.line) == (str(path), 2)  # reads as its first error


def test_the_check_collects_problems_up_to_a_bound(tmp_path):
    write_dataset(tmp_path / "ds", {"dev": [_record()]}, DOCS)
    qa = tmp_path / "ds" / "qa" / "dev.jsonl"
    _write_lines(qa, [_row(id=f"q{i}", question="") for i in range(MAX_ERRORS + 5)])
    errors = check_dataset(tmp_path / "ds")
    assert len(errors) == MAX_ERRORS and {(e.field, e.message) for e in errors} == {("question", "empty")}
    assert [e.line for e in errors] == list(range(1, MAX_ERRORS + 1))
    with pytest.raises(DataErrors, match=f"stopped after {MAX_ERRORS} problems"):
        load_dataset(tmp_path / "ds")


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_written_data_gets_the_mode_the_umask_gives(tmp_path, mask):
    """What is written through a temporary sibling (tempfile: 0700 / 0600) ends with the mode
    mkdir/open would give, so a dataset or a policy can be shared as the user's umask allows."""
    import stat

    from agentr1.fsutil import atomic_file

    before = os.umask(mask)
    try:
        write_dataset(tmp_path / "data", {"dev": [_record()]}, DOCS)
        atomic_file(tmp_path / "summary.json", lambda p: p.write_text("{}"))
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == 0o666 & ~mask
