"""Record formats shared by every data source: the one schema, its check and the loaders (the
writer and the generator's marker: ``agentr1/data/generated.py``).

On disk a dataset is a directory::

    DIR/qa/{split}.jsonl   one QARecord per line: {"id", "question", "answers": [..],
                           "supporting_docs": [doc_id, ..], "hops", "source", ...extra}
    DIR/corpus.jsonl       one Document per line: {"id", "title", "text"}
    DIR/.agentr1-dataset   (only in datasets agentr1 generated) the files it wrote

``check_dataset`` is the one check of that layout: every entry point (the training loader,
``agentr1 data validate``, the DVC validate stage, the pipeline's validation task before its
Great Expectations suites, and ``write_dataset`` on what it has just written) asks it and so
gives the same verdict. Each problem is a ``DataError`` that names the file, the line and the
field, so a user can fix the row without reading this code.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from agentr1.errors import UserError

QA_DIR = "qa"
CORPUS_FILE = "corpus.jsonl"
MARKER_FILE = ".agentr1-dataset"
"""Written by ``generated.write_dataset`` with the data: {"generator": "agentr1", "files": [...], "sha256":
{file: digest}}: what it wrote, and the content it wrote, so a file a user has edited since is
never regenerated over."""
MIN_HOPS = 1
MAX_HOPS = 4
"""What the sources make: synthetic 1-3 hops, HotpotQA 2, MuSiQue 2-4."""
MAX_LINE_BYTES = 1 << 20
"""A longer line is refused before it is parsed: a 50 MB question once made training try to
allocate 34 GB. The largest real record (a MuSiQue question with its decomposition) is ~2 KB."""
MAX_FIELD_CHARS = {"id": 256, "question": 2048, "answers": 1024, "supporting_docs": 256, "source": 256,
                   "title": 1024, "text": 65536}
"""Per-field limits (characters; list fields: per item). Real data stays far below them
(HotpotQA/MuSiQue: questions <= 300, titles <= 80, paragraphs <= 3.5K characters), and the
question goes whole into every prompt."""
MAX_ERRORS = 20
"""A check stops after this many problems: enough to fix a file, bounded on a garbage one."""
_NOT_GENERATED = (f"agentr1 generates data only into a directory that does not exist or that it made "
                  f"({MARKER_FILE}), never into this one")


class DataError(UserError, ValueError):
    """A bad input row: ``str(e) == f"{path}:{line}: field '{field}': {message}"``.

    ``line`` is 1-based (None when the file has no meaningful line, e.g. a JSON list, in
    which case ``field`` carries the record index, e.g. ``[12].answer``).
    """

    def __init__(self, path: str | os.PathLike, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = message if field is None else f"field '{field}': {message}"
        super().__init__(f"{where}: {what}")


def source_file(source: Any) -> str:
    """The file a ``data.sources`` entry (``agentr1.config.DataSource``) converts; a
    :class:`DataError` naming the entry's ``input`` field where it gives none."""
    if source.input is None:
        raise DataError("data.sources", None, "input", f"format {source.format!r} converts a file: give its path")
    return source.input


class DataErrors(DataError):
    """Several problems: reads as the first one (``path``, ``line``, ``field``, ``message``);
    ``errors`` holds them all and ``str()`` lists them, one per line."""

    def __init__(self, errors: list[DataError]):
        first = errors[0]
        super().__init__(first.path, first.line, first.field, first.message)
        self.errors = errors
        more = f"\n(stopped after {MAX_ERRORS} problems)" if len(errors) >= MAX_ERRORS else ""
        self.args = ("\n".join(str(e) for e in errors) + more,)


def raise_errors(errors: list[DataError]) -> None:
    """Raise the one error, or ``DataErrors`` for several; nothing when the list is empty."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise DataErrors(errors)


@dataclass(frozen=True)
class FieldRule:
    """What one field of a record must be. The one definition of the record rules: the loaders
    check every row by them (:meth:`check`), and the Great Expectations suites
    (``adapters/validation.py``) are built from them (:meth:`checks` on the helper columns of
    :meth:`columns`), as ``agentr1.rollout.checks.RULES`` is for rollouts.

    ``kind``: ``text`` (a non-blank string of at most ``MAX_FIELD_CHARS[name]`` characters),
    ``texts`` (a list of such strings, empty only when ``allow_empty``) or ``int`` (an integer in
    ``[lo, hi]``, ``lo >= 0``; JSON ``true`` is not one).
    """

    name: str
    kind: str
    allow_empty: bool = False
    lo: int = 0
    hi: int = 0

    def __post_init__(self):
        if self.kind not in ("text", "texts", "int") or (self.kind == "int" and not 0 <= self.lo <= self.hi):
            raise ValueError(f"bad record rule {self}")

    @property
    def limit(self) -> int:
        return MAX_FIELD_CHARS[self.name]

    # -- the loaders' check of one row

    def check(self, row: "_Checker") -> Any:
        """The field's value in ``row``; raises DataError naming the field when it breaks the rule."""
        if self.kind == "text":
            return row.text(self.name)
        if self.kind == "texts":
            return row.text_list(self.name, self.allow_empty)
        return row.int_between(self.name, self.lo, self.hi)

    # -- the same rule as expectations on helper columns (Great Expectations)

    def columns(self, obj: dict) -> dict[str, int]:
        """Helper columns of one JSON object, always computable (-1 for a missing or mistyped field)."""
        value = obj.get(self.name)
        if self.kind == "text":
            return {f"{self.name}_len": _text_length(value)}
        if self.kind == "texts":
            items = value if isinstance(value, list) else None
            return {f"n_{self.name}": -1 if items is None else len(items),
                    f"n_bad_{self.name}": 0 if items is None else
                    sum(not 1 <= _text_length(v) <= self.limit for v in items)}
        return {self.name: value if isinstance(value, int) and not isinstance(value, bool) else -1}

    def checks(self) -> list[tuple[str, str, str, int | None, int | None]]:
        """``(check name, rule in words, helper column, lo, hi)``: the column must lie in [lo, hi]."""
        if self.kind == "text":
            return [(self.name, f"{self.name} is a non-empty string of at most {self.limit} characters",
                     f"{self.name}_len", 1, self.limit)]
        if self.kind == "texts":
            listed = "a list" if self.allow_empty else "a non-empty list"
            return [(f"{self.name}_list", f"{self.name} is {listed}", f"n_{self.name}", 0 if self.allow_empty else 1,
                     None),
                    (f"{self.name}_items", f"every item of {self.name} is a non-empty string of at most "
                                           f"{self.limit} characters", f"n_bad_{self.name}", 0, 0)]
        return [(self.name, f"{self.name} is an integer in [{self.lo}, {self.hi}]", self.name, self.lo, self.hi)]


def _text_length(value: Any) -> int:
    """-1 for a non-string, 0 for a blank one, else its length (what the limits count)."""
    if not isinstance(value, str):
        return -1
    return len(value) if value.strip() else 0


QA_RULES = (FieldRule("id", "text"), FieldRule("question", "text"), FieldRule("answers", "texts"),
            FieldRule("supporting_docs", "texts", allow_empty=True), FieldRule("hops", "int", lo=MIN_HOPS, hi=MAX_HOPS),
            FieldRule("source", "text"))
DOC_RULES = (FieldRule("id", "text"), FieldRule("title", "text"), FieldRule("text", "text"))
CORE_QA_FIELDS = tuple(r.name for r in QA_RULES)


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
        """Validate one parsed JSON row by ``QA_RULES``; raises DataError naming ``path``, ``line``
        and the field."""
        row = _Checker.of(obj, path, line)
        meta = {k: v for k, v in obj.items() if k not in CORE_QA_FIELDS}
        return cls(**{r.name: r.check(row) for r in QA_RULES}, meta=meta)


def check_record(record: QARecord, path: str | os.PathLike, line: int | None) -> None:
    """``record`` by the schema every loader applies (field sizes, hops), a DataError naming
    ``path``, ``line`` and the field as the loader would: a converter's check of what it made,
    reported against the input row."""
    QARecord.from_json(record.to_json(), path, line)


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
        """Validate one parsed JSON row by ``DOC_RULES``."""
        row = _Checker.of(obj, path, line)
        return cls(**{r.name: r.check(row) for r in DOC_RULES})


class _Checker:
    """Typed field access on one JSON row, raising DataError with the row's location."""

    def __init__(self, path: str | os.PathLike, line: int | None, obj: dict):
        self.path, self.line, self.obj = path, line, obj

    @classmethod
    def of(cls, obj: Any, path: str | os.PathLike, line: int | None) -> "_Checker":
        if not isinstance(obj, dict):
            raise DataError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
        return cls(path, line, obj)

    def fail(self, name: str, message: str) -> DataError:
        return DataError(self.path, self.line, name, message)

    def get(self, name: str) -> Any:
        if name not in self.obj:
            raise self.fail(name, "missing")
        return self.obj[name]

    def _bounded(self, name: str, shown: str, value: str) -> str:
        limit = MAX_FIELD_CHARS[name]
        if len(value) > limit:
            raise self.fail(shown, f"{len(value)} characters, more than the limit of {limit}")
        return value

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {type(value).__name__}")
        if not value.strip():
            raise self.fail(name, "empty")
        return self._bounded(name, name, value)

    def text_list(self, name: str, allow_empty: bool) -> tuple[str, ...]:
        value = self.get(name)
        if not isinstance(value, list):
            raise self.fail(name, f"expected a list of strings, got {type(value).__name__}")
        if not allow_empty and not value:
            raise self.fail(name, "empty list")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                raise self.fail(f"{name}[{i}]", f"expected a non-empty string, got {item!r}")
            self._bounded(name, f"{name}[{i}]", item)
        return tuple(value)

    def int_between(self, name: str, lo: int, hi: int) -> int:
        value = self.get(name)
        # bool is an int subclass; `true` is not a hop count.
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise self.fail(name, f"expected an integer in [{lo}, {hi}], got {value!r}")
        return value


# ---------------------------------------------------------------- reading


def iter_json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any, DataError | None]]:
    """``(line number, parsed value, None)`` or ``(line number, None, error)`` for every
    non-blank line: a line over ``MAX_LINE_BYTES``, not UTF-8 or not JSON is an error of its
    own (never read whole, never an exception). A file that cannot be opened raises DataError."""
    try:
        handle = open(path, "rb")
    except OSError as e:
        raise DataError(path, None, None, f"cannot read: {e.strerror}") from e
    with handle:
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                size = len(raw)
                while not raw.endswith(b"\n") and (raw := handle.readline(MAX_LINE_BYTES)):
                    size += len(raw)  # skip the rest of the line without holding it
                yield number, None, DataError(path, number, None, f"line of {size} bytes, over the limit of "
                                                                  f"{MAX_LINE_BYTES} bytes per record")
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield number, None, DataError(path, number, None, f"not UTF-8 text ({e.reason} at byte {e.start + 1} "
                                                                  f"of the line)")
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                # the column within the line (e.colno counts from the line feed when the JSON ends early)
                column = min(e.pos, len(text.rstrip("\r\n"))) + 1
                yield number, None, DataError(path, number, None, f"not valid JSON ({e.msg} at column {column})")
                continue
            bad = unencodable(obj)
            if bad is not None:
                field_name, at = bad
                yield number, None, DataError(path, number, field_name or None,
                                              f"holds a lone surrogate (a JSON \\udXXX escape that is not half of a "
                                              f"pair) at character {at + 1}: not text that can be encoded or tokenised")
                continue
            yield number, obj, None


def unencodable(obj: Any, where: str = "") -> tuple[str, int] | None:
    """The first string in ``obj`` (keys included) that UTF-8 cannot encode, as (field path,
    character index), or None. JSON's ``\\ud800`` escape decodes to a lone surrogate, which
    every later writer and tokenizer refuses: the one reader of every record file stops it here."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as e:
            return where, e.start
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        name = f"{where}.{key}" if where and isinstance(key, str) else f"{where}[{key}]" if not isinstance(key, str) \
            else key
        found = unencodable(key, name) if isinstance(key, str) else None
        found = found or unencodable(value, name)
        if found:
            return found
    return None


class _Collect:
    """Errors found so far; ``full`` once ``MAX_ERRORS`` are in."""

    def __init__(self, limit: int = MAX_ERRORS):
        self.errors: list[DataError] = []
        self.limit = limit

    def add(self, err: DataError) -> None:
        if not self.full:
            self.errors.append(err)

    @property
    def full(self) -> bool:
        return len(self.errors) >= self.limit

    def in_file_order(self) -> list[DataError]:
        """Files in the order they were read, lines ascending (a file's cross-file checks run last)."""
        files = list(dict.fromkeys(e.path for e in self.errors))
        return sorted(self.errors, key=lambda e: (files.index(e.path), e.line or 0))


def _read_rows(path: Path, parse, what: str, errors: _Collect) -> tuple[list[tuple[int, Any]], set[str]]:
    """``[(line, parsed row)]`` of a JSON-lines file whose rows all pass ``parse(obj, path, line)``,
    and every string id seen (also on rows that failed, so that references to them are not
    reported a second time). Problems go to ``errors``; ids must be unique within the file and
    a file without a single row is an error."""
    rows: list[tuple[int, Any]] = []
    ids: dict[str, int] = {}
    n_lines = 0
    try:
        for line, obj, error in iter_json_lines(path):
            n_lines += 1
            if errors.full:
                break
            if error is not None:
                errors.add(error)
                continue
            rid = obj.get("id") if isinstance(obj, dict) else None
            if isinstance(rid, str) and rid in ids:
                errors.add(DataError(path, line, "id", f"duplicate {what} id {rid!r} (first on line {ids[rid]})"))
                continue
            if isinstance(rid, str):
                ids[rid] = line
            try:
                rows.append((line, parse(obj, path, line)))
            except DataError as e:
                errors.add(e)
    except DataError as e:  # the file itself cannot be read
        errors.add(e)
        return [], set()
    if n_lines == 0:
        errors.add(DataError(path, None, None, f"no {what}s (the file is empty)"))
    return rows, set(ids)


def _raise_collected(run) -> Any:
    errors = _Collect()
    result = run(errors)
    raise_errors(errors.in_file_order())
    return result


def _qa_file(path: Path, errors: _Collect) -> list[tuple[int, QARecord]]:
    return _read_rows(path, QARecord.from_json, "record", errors)[0]


def _corpus_file(path: Path, errors: _Collect) -> tuple[list[Document], set[str]]:
    rows, ids = _read_rows(path, Document.from_json, "document", errors)
    return [d for _, d in rows], ids


def load_qa(path: str | os.PathLike) -> list[QARecord]:
    """QA records of one JSON-lines file, in file order; ids must be unique within the file."""
    return _raise_collected(lambda errors: [r for _, r in _qa_file(Path(path), errors)])


def load_corpus(path: str | os.PathLike) -> list[Document]:
    """Documents of one JSON-lines file, in file order; ids must be unique."""
    return _raise_collected(lambda errors: _corpus_file(Path(path), errors)[0])


def split_path(data_dir: str | os.PathLike, split: str) -> Path:
    return Path(data_dir) / QA_DIR / f"{split}.jsonl"


def corpus_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / CORPUS_FILE


def available_splits(data_dir: str | os.PathLike) -> list[str]:
    """Split names present under DIR/qa, sorted."""
    qa_dir = Path(data_dir) / QA_DIR
    return sorted(p.stem for p in qa_dir.glob("*.jsonl")) if qa_dir.is_dir() else []


def _read_dataset(data_dir: Path, errors: _Collect) -> tuple[dict[str, list[QARecord]], list[Document]]:
    """Every split and the corpus, checked: rows, ids unique within and across splits, every
    supporting doc in the corpus, no empty file, at least one split. Problems go to ``errors``."""
    if not data_dir.is_dir():
        errors.add(DataError(data_dir, None, None, "no such dataset directory" if not data_dir.exists()
                             else "not a directory"))
        return {}, []
    cpath = corpus_path(data_dir)
    if cpath.is_file():
        corpus, doc_ids = _corpus_file(cpath, errors)
    else:
        corpus, doc_ids = [], None
        errors.add(DataError(cpath, None, None, f"missing (every dataset needs its corpus). {_NOT_GENERATED}"))
    names = available_splits(data_dir)
    if not names:
        errors.add(DataError(data_dir / QA_DIR, None, None, f"no QA splits (qa/<split>.jsonl). {_NOT_GENERATED}"))
    splits: dict[str, list[QARecord]] = {}
    seen: dict[str, str] = {}  # record id -> split
    for split in names:
        path = split_path(data_dir, split)
        rows = _qa_file(path, errors)
        for line, record in rows:
            if record.id in seen:
                errors.add(DataError(path, line, "id", f"duplicate record id {record.id!r} "
                                                       f"(also in split {seen[record.id]!r})"))
            seen.setdefault(record.id, split)
            for i, doc_id in enumerate(record.supporting_docs):
                if doc_ids is not None and doc_id not in doc_ids:
                    errors.add(DataError(path, line, f"supporting_docs[{i}]", f"doc id {doc_id!r} is not in the corpus"))
        splits[split] = [r for _, r in rows]
    return splits, corpus


def check_dataset(data_dir: str | os.PathLike) -> list[DataError]:
    """Every problem of a dataset directory (up to ``MAX_ERRORS``); empty when it is valid.

    The one check every entry point uses: see the module docstring."""
    errors = _Collect()
    _read_dataset(Path(data_dir), errors)
    return errors.in_file_order()


def load_dataset(data_dir: str | os.PathLike) -> tuple[dict[str, list[QARecord]], list[Document]]:
    """Every split of a dataset dir plus its corpus, after ``check_dataset``'s checks (raises
    DataError, or DataErrors listing up to ``MAX_ERRORS`` problems)."""
    return _raise_collected(lambda errors: _read_dataset(Path(data_dir), errors))


def load_split(data_dir: str | os.PathLike, split: str) -> list[QARecord]:
    """DIR/qa/{split}.jsonl of a dataset that passes ``check_dataset`` as a whole."""
    splits, _ = load_dataset(data_dir)
    if split not in splits:
        raise DataError(split_path(data_dir, split), None, None, f"no such split (the dataset has {sorted(splits)})")
    return splits[split]


def resource_files(data_dir: str | os.PathLike) -> list[Path]:
    """What a dataset holds beside its records: ``corpus.jsonl`` and every other file at its top
    level (a generator's ``files``: the SQL world's database, a plug-in's catalogue), not the
    marker or hidden files. The environment's tools read these; a logged agent carries them."""
    data_dir = Path(data_dir)
    return sorted((p for p in data_dir.iterdir() if p.is_file() and not p.name.startswith(".")),
                  key=lambda p: (p.name != CORPUS_FILE, p.name))


def load_corpus_dir(data_dir: str | os.PathLike) -> list[Document]:
    """DIR/corpus.jsonl."""
    return load_corpus(corpus_path(data_dir))


# ---------------------------------------------------------------- the canonical form


def to_jsonl(objects: Iterable[dict]) -> str:
    """Canonical JSON lines: key order as given, UTF-8 text, one object per line."""
    return "".join(json.dumps(o, ensure_ascii=False, sort_keys=False) + "\n" for o in objects)


def corpus_digest(corpus: Iterable[Document]) -> str:
    """sha256 (hex) of the canonical corpus.jsonl bytes: the corpus's content address."""
    return hashlib.sha256(to_jsonl(d.to_json() for d in corpus).encode("utf-8")).hexdigest()
