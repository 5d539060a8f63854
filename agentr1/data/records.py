"""Record formats shared by every data source, and their validating loaders and writer.

On disk a dataset is a directory::

    DIR/qa/{split}.jsonl   one QARecord per line: {"id", "question", "answers": [..],
                           "supporting_docs": [doc_id, ..], "hops", "source", ...extra}
    DIR/corpus.jsonl       one Document per line: {"id", "title", "text"}

Every loader rejects a bad row with a ``DataError`` that names the file, the line and the
field, so a user can fix the row without reading this code. ``write_dataset`` validates
everything first, writes into a temporary sibling directory and renames it at the end, so a
failure never leaves a partial dataset behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from agentr1.fsutil import atomic_dir

QA_DIR = "qa"
CORPUS_FILE = "corpus.jsonl"
CORE_QA_FIELDS = ("id", "question", "answers", "supporting_docs", "hops", "source")
DOC_FIELDS = ("id", "title", "text")
# Split names become file names; keep them to a safe alphabet.
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DataError(ValueError):
    """A bad input row: ``str(e) == f"{path}:{line}: field '{field}': {message}"``.

    ``line`` is 1-based (None when the file has no meaningful line, e.g. a JSON list, in
    which case ``field`` carries the record index, e.g. ``[12].answer``).
    """

    def __init__(self, path: str | os.PathLike, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = message if field is None else f"field '{field}': {message}"
        super().__init__(f"{where}: {what}")


@dataclass(frozen=True)
class QARecord:
    """One question. ``meta`` holds every extra JSON field, written back unchanged."""

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_docs: tuple[str, ...]
    hops: int
    source: str
    meta: dict = field(default_factory=dict, hash=False)  # compared, but dicts cannot be hashed

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "supporting_docs": list(self.supporting_docs),
            "hops": self.hops,
            "source": self.source,
        }
        out.update(self.meta)
        return out

    @classmethod
    def from_json(cls, obj: Any, path: str | os.PathLike = "<record>", line: int | None = None) -> "QARecord":
        """Validate one parsed JSON row; raises DataError naming ``path``, ``line`` and the field."""
        if not isinstance(obj, dict):
            raise DataError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
        err = _Checker(path, line, obj)
        meta = {k: v for k, v in obj.items() if k not in CORE_QA_FIELDS}
        return cls(
            id=err.text("id"),
            question=err.text("question"),
            answers=err.text_list("answers", allow_empty=False),
            supporting_docs=err.text_list("supporting_docs", allow_empty=True),
            hops=err.positive_int("hops"),
            source=err.text("source"),
            meta=meta,
        )


@dataclass(frozen=True)
class Document:
    """One searchable passage."""

    id: str
    title: str
    text: str

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "text": self.text}

    @classmethod
    def from_json(cls, obj: Any, path: str | os.PathLike = "<document>", line: int | None = None) -> "Document":
        if not isinstance(obj, dict):
            raise DataError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
        err = _Checker(path, line, obj)
        return cls(id=err.text("id"), title=err.text("title", allow_empty=True), text=err.text("text"))


class _Checker:
    """Typed field access on one JSON row, raising DataError with the row's location."""

    def __init__(self, path: str | os.PathLike, line: int | None, obj: dict):
        self.path, self.line, self.obj = path, line, obj

    def fail(self, name: str, message: str) -> DataError:
        return DataError(self.path, self.line, name, message)

    def get(self, name: str) -> Any:
        if name not in self.obj:
            raise self.fail(name, "missing")
        return self.obj[name]

    def text(self, name: str, allow_empty: bool = False) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {type(value).__name__}")
        if not allow_empty and not value.strip():
            raise self.fail(name, "empty")
        return value

    def text_list(self, name: str, allow_empty: bool) -> tuple[str, ...]:
        value = self.get(name)
        if not isinstance(value, list):
            raise self.fail(name, f"expected a list of strings, got {type(value).__name__}")
        if not allow_empty and not value:
            raise self.fail(name, "empty list")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                raise self.fail(f"{name}[{i}]", f"expected a non-empty string, got {item!r}")
        return tuple(value)

    def positive_int(self, name: str) -> int:
        value = self.get(name)
        # bool is an int subclass; `true` is not a hop count.
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.fail(name, f"expected a positive integer, got {value!r}")
        return value


# ---------------------------------------------------------------- reading


def _json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line of a JSON-lines file."""
    try:
        handle = open(path, encoding="utf-8")
    except OSError as e:
        raise DataError(path, None, None, f"cannot read: {e.strerror}") from e
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except json.JSONDecodeError as e:
                raise DataError(path, number, None, f"not valid JSON ({e.msg} at column {e.colno})") from e


def _unique(items: Iterable[tuple[int | None, str]], path: str | os.PathLike, what: str) -> None:
    """Raise on the second occurrence of an id; items are (line, id)."""
    first: dict[str, int | None] = {}
    for line, item_id in items:
        if item_id in first:
            raise DataError(path, line, "id", f"duplicate {what} id {item_id!r} (first on line {first[item_id]})")
        first[item_id] = line


def _qa_rows(path: str | os.PathLike) -> list[tuple[int, QARecord]]:
    """(line, record) for every row of a QA file; ids must be unique within the file."""
    rows = [(line, QARecord.from_json(obj, path, line)) for line, obj in _json_lines(path)]
    _unique(((line, r.id) for line, r in rows), path, "record")
    return rows


def load_qa(path: str | os.PathLike) -> list[QARecord]:
    """QA records of one JSON-lines file, in file order; ids must be unique within the file."""
    return [r for _, r in _qa_rows(path)]


def load_corpus(path: str | os.PathLike) -> list[Document]:
    """Documents of one JSON-lines file, in file order; ids must be unique."""
    rows = [(line, Document.from_json(obj, path, line)) for line, obj in _json_lines(path)]
    _unique(((line, d.id) for line, d in rows), path, "document")
    return [d for _, d in rows]


def split_path(data_dir: str | os.PathLike, split: str) -> Path:
    return Path(data_dir) / QA_DIR / f"{split}.jsonl"


def corpus_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / CORPUS_FILE


def available_splits(data_dir: str | os.PathLike) -> list[str]:
    """Split names present under DIR/qa, sorted."""
    qa_dir = Path(data_dir) / QA_DIR
    return sorted(p.stem for p in qa_dir.glob("*.jsonl")) if qa_dir.is_dir() else []


def _check_support(rows: list[tuple[int, QARecord]], doc_ids: set[str], path: str | os.PathLike) -> None:
    for line, record in rows:
        for i, doc_id in enumerate(record.supporting_docs):
            if doc_id not in doc_ids:
                raise DataError(path, line, f"supporting_docs[{i}]", f"doc id {doc_id!r} is not in the corpus")


def _check_unique_across(rows: list[tuple[int, QARecord]], seen: dict[str, str], split: str, path) -> None:
    """Record ids must be unique across all splits of a dataset; ``seen`` maps id -> split."""
    for line, record in rows:
        if record.id in seen:
            raise DataError(path, line, "id", f"duplicate record id {record.id!r} (also in split {seen[record.id]!r})")
        seen[record.id] = split


def load_split(data_dir: str | os.PathLike, split: str) -> list[QARecord]:
    """DIR/qa/{split}.jsonl, with every supporting doc id checked against DIR/corpus.jsonl."""
    path = split_path(data_dir, split)
    rows = _qa_rows(path)
    _check_support(rows, {d.id for d in load_corpus_dir(data_dir)}, path)
    return [r for _, r in rows]


def load_corpus_dir(data_dir: str | os.PathLike) -> list[Document]:
    """DIR/corpus.jsonl."""
    return load_corpus(corpus_path(data_dir))


def load_dataset(data_dir: str | os.PathLike) -> tuple[dict[str, list[QARecord]], list[Document]]:
    """Every split of a dataset dir plus its corpus; ids unique across splits, support checked."""
    corpus = load_corpus_dir(data_dir)
    doc_ids = {d.id for d in corpus}
    splits: dict[str, list[QARecord]] = {}
    seen: dict[str, str] = {}
    for split in available_splits(data_dir):
        path = split_path(data_dir, split)
        rows = _qa_rows(path)
        _check_support(rows, doc_ids, path)
        _check_unique_across(rows, seen, split, path)
        splits[split] = [r for _, r in rows]
    return splits, corpus


# ---------------------------------------------------------------- writing


def to_jsonl(objects: Iterable[dict]) -> str:
    """Canonical JSON lines: key order as given, UTF-8 text, one object per line."""
    return "".join(json.dumps(o, ensure_ascii=False, sort_keys=False) + "\n" for o in objects)


def corpus_digest(corpus: Iterable[Document]) -> str:
    """sha256 (hex) of the canonical corpus.jsonl bytes: the corpus's content address."""
    return hashlib.sha256(to_jsonl(d.to_json() for d in corpus).encode("utf-8")).hexdigest()


def validate_dataset(out_dir: str | os.PathLike, splits: dict[str, list[QARecord]], corpus: list[Document]) -> None:
    """Everything ``write_dataset`` checks, reported against the files it would write."""
    cpath = corpus_path(out_dir)
    if not corpus:
        raise DataError(cpath, None, None, "the corpus is empty")
    for line, doc in enumerate(corpus, start=1):
        Document.from_json(doc.to_json(), cpath, line)
    _unique(((line, d.id) for line, d in enumerate(corpus, start=1)), cpath, "document")
    doc_ids = {d.id for d in corpus}
    seen: dict[str, str] = {}
    for split, records in splits.items():
        path = split_path(out_dir, split)
        if not _SPLIT_NAME.match(split):
            raise DataError(path, None, None, f"bad split name {split!r} (letters, digits, '_', '-', '.')")
        rows = list(enumerate(records, start=1))
        for line, record in rows:
            QARecord.from_json(record.to_json(), path, line)
        _check_unique_across(rows, seen, split, path)
        _check_support(rows, doc_ids, path)


def _looks_like_dataset(path: Path) -> bool:
    """Only a dataset dir (or an empty dir) may be replaced: never clobber unrelated files."""
    return not any(path.iterdir()) or (path / QA_DIR).is_dir() or (path / CORPUS_FILE).is_file()


def write_dataset(
    out_dir: str | os.PathLike,
    splits: dict[str, list[QARecord]],
    corpus: list[Document],
    overwrite: bool = True,
) -> None:
    """Validate, then write DIR/qa/{split}.jsonl and DIR/corpus.jsonl atomically.

    The files are written into a temporary sibling directory that is renamed to ``out_dir``
    at the end, so an error leaves no partial output. An existing dataset dir is replaced
    when ``overwrite`` (a directory that does not look like a dataset is never replaced).
    """
    target = Path(out_dir)
    validate_dataset(target, splits, corpus)
    if target.exists():
        if not overwrite or not target.is_dir() or not _looks_like_dataset(target):
            raise FileExistsError(f"{target}: exists and is not a dataset directory to replace")

    def write(tmp: Path) -> None:
        (tmp / QA_DIR).mkdir()
        for split, records in splits.items():
            split_path(tmp, split).write_text(to_jsonl(r.to_json() for r in records), encoding="utf-8")
        corpus_path(tmp).write_text(to_jsonl(d.to_json() for d in corpus), encoding="utf-8")

    atomic_dir(target, write)
