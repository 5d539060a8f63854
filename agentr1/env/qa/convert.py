"""The ``qa`` kind's converters: public multi-hop QA datasets into the shared record format.

- ``hotpotqa``: the distractor setting, in the original layout (``_id``, ``supporting_facts:
  [[title, sent_id]]``, ``context: [[title, [sentences]]]``) or the Hugging Face layout
  (``id``, ``supporting_facts: {title: [], sent_id: []}``, ``context: {title: [],
  sentences: [[]]}``), detected per record. hops = 2.
- ``musique``: MuSiQue-Ans (``paragraphs[].is_supporting``, ``answer_aliases`` become extra
  gold answers, hops from the id prefix ``2hop__``/``3hop1__``/...). Unanswerable records
  (MuSiQue-Full) are skipped: their gold answer is not supported by the paragraphs.

Input is a JSON list or JSON lines. The corpus is the pool of distinct paragraphs of all
records (deduplicated by (title, text)), in order of first appearance; a paragraph's id is a
short sha1 of its title and text, so the same paragraph gets the same id in every
conversion. Where the records go is ``agentr1.data.splits``' one rule; the pipeline's data
form, ``data.sources`` and ``agentr1 data convert`` all write through ``agentr1.env.datasets``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from agentr1.data.records import DataError, Document, QARecord, source_file, unencodable
from agentr1.data.splits import SYNTHETIC

if TYPE_CHECKING:
    from agentr1.config import DataSource

DOC_ID_CHARS = 16
HOTPOTQA_HOPS = 2
_HOPS_PREFIX = re.compile(r"^(\d+)hop")


@dataclass(frozen=True)
class _Row:
    """One input record and where it came from (JSON lines: a line; JSON list: an index)."""

    path: str
    line: int | None
    index: int
    obj: Any

    def error(self, field: str, message: str) -> DataError:
        # A JSON list has no useful line numbers (often one line); name the record index instead.
        where = field if self.line is not None else f"[{self.index}].{field}"
        return DataError(self.path, self.line, where, message)

    def get(self, field: str, kind: type | tuple[type, ...]) -> Any:
        if not isinstance(self.obj, dict):
            raise DataError(self.path, self.line, None if self.line else f"[{self.index}]", "expected a JSON object")
        if field not in self.obj:
            raise self.error(field, "missing")
        value = self.obj[field]
        if not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise self.error(field, f"expected {names}, got {type(value).__name__}")
        return value

    def text(self, field: str) -> str:
        value = self.get(field, str)
        if not value.strip():
            raise self.error(field, "empty")
        return value


def read_rows(path: str | os.PathLike) -> Iterator[_Row]:
    """Records of a JSON list file or a JSON-lines file."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(path, None, None, f"cannot read: {e.strerror}") from e
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(path, line, None, f"not UTF-8 text ({e.reason} at byte {e.start + 1} of the file)") from e
    try:
        whole = json.loads(raw)
    except json.JSONDecodeError:
        whole = None  # not one JSON document: JSON lines (or garbage, reported per line)
    if isinstance(whole, list):
        yield from (_checked_text(_Row(path, None, i, obj)) for i, obj in enumerate(whole))
        return
    index = 0
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, number, None, f"not valid JSON ({e.msg} at column {e.colno})") from e
        yield _checked_text(_Row(path, number, index, obj))
        index += 1


def _checked_text(row: _Row) -> _Row:
    """The row, unless a string in it (a key included) is not encodable text: JSON's lone-surrogate
    escapes (``\\ud800``) decode to strings no writer or tokenizer takes."""
    bad = unencodable(row.obj)
    if bad is not None:
        field, at = bad
        raise row.error(field or "(record)", f"holds a lone surrogate (a JSON \\udXXX escape that is not half of "
                                             f"a pair) at character {at + 1}: not text that can be encoded")
    return row


def doc_id(title: str, text: str) -> str:
    """Stable id of a paragraph: the first hex digits of sha1(title + newline + text)."""
    return hashlib.sha1(f"{title}\n{text}".encode("utf-8")).hexdigest()[:DOC_ID_CHARS]


class _Pool:
    """Distinct paragraphs in first-appearance order."""

    def __init__(self) -> None:
        self.docs: list[Document] = []
        self._by_id: dict[str, Document] = {}

    def add(self, title: str, text: str) -> str:
        key = doc_id(title, text)
        known = self._by_id.get(key)
        if known is None:
            known = self._by_id[key] = Document(key, title, text)
            self.docs.append(known)
        elif (known.title, known.text) != (title, text):
            raise ValueError(f"doc id collision on {key}: widen DOC_ID_CHARS")
        return key


# ---------------------------------------------------------------- HotpotQA


def _hotpot_layout(row: _Row) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int]]]:
    """(context [(title, sentences)], supporting facts [(title, sent_id)]) of either layout."""
    context = row.get("context", (list, dict))
    facts = row.get("supporting_facts", (list, dict))
    try:
        if isinstance(context, dict):  # Hugging Face: columns
            paragraphs = list(zip(context["title"], context["sentences"], strict=True))
        else:
            paragraphs = [(title, sentences) for title, sentences in context]
    except (KeyError, TypeError, ValueError) as e:
        raise row.error("context", f"expected [[title, [sentences]]] or {{title: [], sentences: [[]]}} ({e})") from e
    try:
        if isinstance(facts, dict):
            support = list(zip(facts["title"], facts["sent_id"], strict=True))
        else:
            support = [(title, sent_id) for title, sent_id in facts]
    except (KeyError, TypeError, ValueError) as e:
        raise row.error("supporting_facts", f"expected [[title, sent_id]] or {{title: [], sent_id: []}} ({e})") from e
    for i, (title, sent_id) in enumerate(support):
        if not isinstance(title, str) or isinstance(sent_id, bool) or not isinstance(sent_id, int):
            raise row.error(f"supporting_facts[{i}]", f"expected [title string, sentence index], got "
                                                      f"[{title!r:.80}, {sent_id!r:.20}]")
    for i, (title, sentences) in enumerate(paragraphs):
        if not isinstance(title, str) or not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise row.error(f"context[{i}]", "expected a title string and a list of sentence strings")
        if not title.strip():  # the corpus schema needs a title on every document
            raise row.error(f"context[{i}]", "empty title")
    return paragraphs, support


def _hotpot_record(row: _Row, pool: _Pool) -> QARecord:
    record_id = row.text("_id" if isinstance(row.obj, dict) and "_id" in row.obj else "id")
    paragraphs, support = _hotpot_layout(row)
    ids_by_title: dict[str, str] = {}
    for title, sentences in paragraphs:
        text = "".join(sentences).strip()
        if text and title not in ids_by_title:
            ids_by_title[title] = pool.add(title, text)
    supporting: list[str] = []
    for i, (title, _) in enumerate(support):
        if title not in ids_by_title:
            raise row.error(f"supporting_facts[{i}]", f"title {title!r} is not a (non-empty) context paragraph")
        if ids_by_title[title] not in supporting:
            supporting.append(ids_by_title[title])
    meta = {"supporting_facts": [[t, s] for t, s in support]}
    for key in ("type", "level"):
        if isinstance(row.obj.get(key), str):
            meta[key] = row.obj[key]
    return QARecord(record_id, row.text("question"), (row.text("answer"),), tuple(supporting), HOTPOTQA_HOPS, "hotpotqa", meta)


# ---------------------------------------------------------------- MuSiQue


def _musique_hops(row: _Row, record_id: str) -> int:
    match = _HOPS_PREFIX.match(record_id)
    if match:
        return int(match.group(1))
    decomposition = row.obj.get("question_decomposition")
    if isinstance(decomposition, list) and decomposition:
        return len(decomposition)
    raise row.error("id", f"cannot tell the hop count: {record_id!r} has no 'Nhop' prefix and no question_decomposition")


def _musique_answers(row: _Row) -> tuple[str, ...]:
    answers = [row.text("answer")]
    aliases = row.obj.get("answer_aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise row.error("answer_aliases", "expected a list of strings")
    for alias in aliases:
        if alias.strip() and alias not in answers:
            answers.append(alias)
    return tuple(answers)


def _musique_record(row: _Row, pool: _Pool) -> QARecord | None:
    record_id = row.text("id")
    answerable = row.obj.get("answerable", True)
    if not isinstance(answerable, bool):
        raise row.error("answerable", f"expected true or false, got {answerable!r:.40}")
    if not answerable:
        return None
    supporting: list[str] = []
    for i, paragraph in enumerate(row.get("paragraphs", list)):
        if not isinstance(paragraph, dict) or not isinstance(paragraph.get("paragraph_text"), str):
            raise row.error(f"paragraphs[{i}].paragraph_text", "expected a string")
        title, text = paragraph.get("title", ""), paragraph["paragraph_text"].strip()
        if not isinstance(title, str):
            raise row.error(f"paragraphs[{i}].title", f"expected a string, got {type(title).__name__}")
        if not isinstance(paragraph.get("is_supporting", False), bool):
            raise row.error(f"paragraphs[{i}].is_supporting", f"expected true or false, got "
                                                              f"{paragraph['is_supporting']!r:.40}")
        if not text:
            if paragraph.get("is_supporting"):
                raise row.error(f"paragraphs[{i}].paragraph_text", "a supporting paragraph is empty")
            continue
        if not title.strip():  # the corpus schema needs a title on every document
            raise row.error(f"paragraphs[{i}].title", "missing or empty")
        key = pool.add(title, text)
        if paragraph.get("is_supporting") is True and key not in supporting:
            supporting.append(key)
    meta = {"hop_type": record_id.split("__", 1)[0]}
    if "question_decomposition" in row.obj:
        meta["question_decomposition"] = row.obj["question_decomposition"]
    hops = _musique_hops(row, record_id)
    return QARecord(record_id, row.text("question"), _musique_answers(row), tuple(supporting), hops, "musique", meta)


# ---------------------------------------------------------------- entry points

CONVERTERS: dict[str, Callable[[_Row, _Pool], QARecord | None]] = {
    "hotpotqa": _hotpot_record,
    "musique": _musique_record,
}


SOURCE_KINDS = (SYNTHETIC, *sorted(CONVERTERS))
"""Where a dataset comes from: the environment's generator, or one of the converters."""


def _check_against_schema(row: _Row, record: QARecord, new_docs: list[Document]) -> None:
    """The record and the paragraphs it added, by the schema every loader applies (field sizes,
    hops), reported against the input row rather than the file the converter would write."""
    for where, check, obj in ((None, QARecord.from_json, record.to_json()),
                              *((f"paragraph {d.title!r:.60}", Document.from_json, d.to_json()) for d in new_docs)):
        try:
            check(obj)
        except DataError as e:
            raise row.error(e.field or "(record)", e.message if where is None else f"{where}: {e.message}") from None


def convert(fmt: str, input_path: str | os.PathLike) -> tuple[list[QARecord], list[Document]]:
    """Records (input order, unconvertible ones skipped) and the pooled paragraph corpus."""
    if fmt not in CONVERTERS:
        raise ValueError(f"unknown format {fmt!r}; choose from {sorted(CONVERTERS)}")
    pool, records = _Pool(), []
    first_seen: dict[str, int] = {}
    for row in read_rows(input_path):
        before = len(pool.docs)
        record = CONVERTERS[fmt](row, pool)
        if record is None:
            continue
        _check_against_schema(row, record, pool.docs[before:])
        if record.id in first_seen:
            raise row.error("id", f"duplicate id {record.id!r} (first in record {first_seen[record.id]})")
        first_seen[record.id] = row.index
        records.append(record)
    if not records:
        raise DataError(input_path, None, None, f"no {fmt} records found")
    return records, pool.docs


# ---------------------------------------------------------------- the registry's signature

def convert_hotpotqa(source: DataSource) -> tuple[list[QARecord], list[Document], dict[str, int]]:
    return (*convert("hotpotqa", source_file(source)), {})


def convert_musique(source: DataSource) -> tuple[list[QARecord], list[Document], dict[str, int]]:
    return (*convert("musique", source_file(source)), {})
