"""BFCL (the Berkeley Function Calling Leaderboard) as records and as the judge of a call.

The questions, their ``possible_answer`` files and the official AST checker come from the
``bfcl-eval`` package (Apache-2.0, installed by ``make setup`` without its dependencies: it
pins numpy and pulls every API client). Its data files are read with ``importlib.resources``;
its checker, ``bfcl_eval.eval_checker.ast_eval.ast_checker``, is imported as it is, with one
module put in its place first: ``bfcl_eval.constants.model_config``, which imports every model
handler (and so ``openai``, ``anthropic``, ``tree_sitter`` ...), is read by the checker only for
``MODEL_CONFIG_MAPPING[model].underscore_to_dot`` (whether a model that cannot write dots in a
function name is judged with underscores). :data:`CHECKER_MODEL` writes the names as given, so
that module is a one-entry mapping here (:func:`official_checker`).

The categories used are BFCL's single-call Python AST categories (:data:`CATEGORIES`): one user
question (after an optional system message), its functions, one gold call with the accepted
values of each argument (``""`` among them: the argument may be left out).

A record (the shared QA format, :class:`agentr1.data.records.QARecord`) keeps the question in
``question``, the gold function's name as its one answer, the number of functions it offers as
``hops`` (4: four or more; evaluations report each), and BFCL's own fields in ``meta``: ``functions`` (the function documents as BFCL
ships them), ``ground_truth`` (the possible answers), ``category``, ``system`` (the question's
own system message, when it has one), and ``calls``: the one canonical gold call the warm-up
demonstrates (:func:`canonical_call`; the checker accepts it, a test holds that for every record).
"""
from __future__ import annotations

import copy
import hashlib
import importlib.resources
import json
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from agentr1.data.records import MAX_HOPS, DataError, Document, QARecord, iter_json_lines

if TYPE_CHECKING:
    from agentr1.config import DataSource

VERSION_PREFIX = "BFCL_v4"
"""The data files' prefix in bfcl-eval 2026.3.23 (``BFCL_v4_<category>.json``)."""
CATEGORIES = ("simple_python", "live_simple", "multiple", "live_multiple")
"""The single-call Python categories (``parallel`` needs several calls in one turn; the others
are other languages, irrelevance or multi-turn)."""
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
"""What BFCL appends to every Python function's description before it is shown to a model
(``bfcl_eval.utils._get_language_specific_hint``); kept here because importing ``bfcl_eval.utils``
creates result folders in site-packages."""
CHECKER_MODEL = "agentr1"
"""The model name the checker is given (``MODEL_CONFIG_MAPPING`` entry: names written as given)."""
INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23 (make setup installs it)"


class BFCLMissing(DataError):
    """bfcl-eval is not installed (and no BFCL data directory was given)."""


def data_root(given: str | None = None) -> Path:
    """The directory holding ``BFCL_v4_<category>.json`` and ``possible_answer/``: ``given``, or
    the installed bfcl-eval's ``bfcl_eval/data``."""
    if given is not None:
        return Path(given)
    try:
        return Path(str(importlib.resources.files("bfcl_eval") / "data"))
    except ModuleNotFoundError:
        raise BFCLMissing("bfcl_eval", None, None, f"the BFCL data comes from the bfcl-eval package: "
                          f"{INSTALL_HINT}, or give the data directory (--input)") from None


def official_checker():
    """BFCL's ``ast_checker`` (module docstring: how it is imported without its model handlers)."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.__doc__ = "agentr1's stand-in: the one model the checker is asked about (bfcl.py)"
        stand_in.MODEL_CONFIG_MAPPING = {CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=False)}
        sys.modules[name] = stand_in
    try:
        from bfcl_eval.eval_checker.ast_eval import ast_checker
    except ModuleNotFoundError:
        raise BFCLMissing("bfcl_eval", None, None, f"BFCL's checker comes from the bfcl-eval package: {INSTALL_HINT}"
                          ) from None
    return ast_checker


@dataclass(frozen=True)
class Verdict:
    """What a call scored: the official checker's verdict and its decomposed parts."""

    valid: bool
    """BFCL's AST checker accepts the call."""
    error_type: str
    """The checker's ``error_type`` ("" when valid)."""
    name: bool
    """The call names the gold function."""
    keys: bool
    """...with exactly the argument names the gold call allows."""
    values: float
    """...and this share of the gold call's arguments right (given an accepted value, or left
    out where leaving it out is accepted)."""

    @property
    def partial(self) -> float:
        """Partial credit in [0, 1]: the mean of the three parts (1 when valid)."""
        return 1.0 if self.valid else (self.name + self.keys + self.values) / 3


def _language():
    from bfcl_eval.constants.enums import Language

    return Language.PYTHON


def _safe_check(checker, *args) -> dict:
    """A checker call that never raises: model-written values are hostile input (a wrong type
    where the checker indexes, a structure it does not expect), and an exception there is a
    wrong call, as BFCL's runner counts a call it cannot decode."""
    try:
        result = checker(*args)
    except Exception as err:  # noqa: BLE001 - the policy's output must never crash a run
        return {"valid": False, "error_type": f"checker_error:{type(err).__name__}"}
    return result if isinstance(result, dict) else {"valid": False, "error_type": "checker_error:result"}


def judge(functions: list[dict], ground_truth: list[dict], category: str, name: str, arguments: dict) -> Verdict:
    """Score one call (``name`` with ``arguments``, parsed from the policy's turn) against a
    record's gold: BFCL's checker for the verdict, the same checker argument by argument for the
    share of values right."""
    checker = official_checker()
    language = _language()
    output = [{name: arguments}]
    verdict = _safe_check(checker.ast_checker, functions, output, ground_truth, language, category, CHECKER_MODEL)
    gold_name, answers = next(iter(ground_truth[0].items()))
    if bool(verdict.get("valid")):
        return Verdict(True, "", True, True, 1.0)
    error = str(verdict.get("error_type", ""))
    if name != gold_name:
        return Verdict(False, error, False, False, 0.0)
    doc = next((f for f in functions if f.get("name") == gold_name), None)
    needed = {k for k, v in answers.items() if "" not in v}
    keys = set(arguments) <= set(answers) and needed <= set(arguments)
    right = 0
    for param, accepted in answers.items():
        if param not in arguments:
            right += "" in accepted
        elif doc is not None and param in doc.get("parameters", {}).get("properties", {}):
            one = copy.deepcopy(doc)
            one["parameters"] = {**doc["parameters"], "required": [],
                                 "properties": {param: doc["parameters"]["properties"][param]}}
            result = _safe_check(checker.simple_function_checker, one, {name: {param: arguments[param]}},
                                 {name: {param: accepted}}, language, CHECKER_MODEL)
            right += bool(result.get("valid"))
    return Verdict(False, error, True, keys, right / len(answers) if answers else 1.0)


def _first(accepted: Any) -> Any:
    """The first accepted value that is not ``""`` (``""`` means "may be left out"; where it is the
    only one, ``""`` itself)."""
    return next((v for v in accepted if v != ""), "") if isinstance(accepted, list) else accepted


def _inner(value: dict) -> dict:
    """A dictionary argument as BFCL's ``dict_checker`` reads its possible answer: each key with
    its accepted values, optional keys left out (one level: deeper values are compared whole)."""
    return {k: _first(v) for k, v in value.items() if not (isinstance(v, list) and "" in v)}


def canonical_value(accepted: list) -> Any:
    """The value a demonstration gives an argument: its first accepted value that is not ``""``,
    a dictionary (or each of a list of them) with its own keys made canonical the same way."""
    value = _first(accepted)
    if isinstance(value, dict):
        return _inner(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_inner(v) for v in value]
    return value


def canonical_call(ground_truth: list[dict], function: dict | None = None) -> dict:
    """The gold call a demonstration makes: ``{"name", "arguments"}``, each argument that may not be
    left out (or that ``function``'s document requires) with its first accepted value."""
    name, answers = next(iter(ground_truth[0].items()))
    required = set((function or {}).get("parameters", {}).get("required", []))
    return {"name": name, "arguments": {k: canonical_value(v) for k, v in answers.items()
                                        if v and ("" not in v or k in required)}}


def prompt_functions(functions: list[dict]) -> list[dict]:
    """The function documents as BFCL shows them to a model: each description with the Python hint."""
    out = copy.deepcopy(functions)
    for f in out:
        f["description"] = str(f.get("description", "")) + PYTHON_HINT
    return out


def prompt_chars(question: str, functions: list[dict], system: str | None = None) -> int:
    """The size of a record's prompt in characters (question, system message, function documents)."""
    return len(question) + len(system or "") + len(json.dumps(prompt_functions(functions), ensure_ascii=False))


def function_doc(function: dict) -> Document:
    """A function document as a corpus entry (the corpus of a BFCL dataset: every function its
    questions offer, one entry each)."""
    text = json.dumps(function, ensure_ascii=False, sort_keys=True)
    return Document("fn-" + hashlib.sha256(text.encode()).hexdigest()[:16], str(function.get("name", "?")), text)


def _rows(path: Path) -> Iterator[tuple[int, dict]]:
    for line, obj, error in iter_json_lines(path):
        if error is not None:
            raise error
        if not isinstance(obj, dict):
            raise DataError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
        yield line, obj


def _record(path: Path, line: int, entry: dict, answer: dict, category: str) -> QARecord:
    """One BFCL entry and its possible answer as a record; DataError naming the field otherwise."""
    rid = entry.get("id")
    if not isinstance(rid, str) or answer.get("id") != rid:
        raise DataError(path, line, "id", f"entry {rid!r} has no possible answer on the same line "
                        f"(possible_answer has {answer.get('id')!r})")
    turns = entry.get("question")
    if not (isinstance(turns, list) and len(turns) == 1 and isinstance(turns[0], list)):
        raise DataError(path, line, "question", "expected one turn (a list with one list of messages)")
    messages = turns[0]
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if roles not in (["user"], ["system", "user"]) or not all(isinstance(m.get("content"), str) for m in messages):
        raise DataError(path, line, "question", f"expected [user] or [system, user] messages with text, got {roles}")
    functions = entry.get("function")
    if not (isinstance(functions, list) and functions and all(
            isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("parameters"), dict)
            for f in functions)):
        raise DataError(path, line, "function", "expected a list of function documents with name and parameters")
    truth = answer.get("ground_truth")
    if not (isinstance(truth, list) and len(truth) == 1 and isinstance(truth[0], dict) and len(truth[0]) == 1
            and isinstance(next(iter(truth[0].values())), dict)):
        raise DataError(path, line, "ground_truth", "expected one gold call: [{function name: {argument: [values]}}]")
    gold = next(iter(truth[0]))
    if gold not in {f["name"] for f in functions}:
        raise DataError(path, line, "ground_truth", f"the gold function {gold!r} is not among the entry's functions")
    call = canonical_call(truth, next(f for f in functions if f["name"] == gold))
    meta: dict[str, Any] = {"category": category, "functions": functions, "ground_truth": truth, "calls": [call]}
    if roles[0] == "system":
        meta["system"] = messages[0]["content"]
    return QARecord(rid, messages[-1]["content"], (gold,), (), min(len(functions), MAX_HOPS), f"bfcl/{category}",
                    meta)


def read_category(root: Path, category: str) -> Iterator[tuple[Path, int, QARecord]]:
    """The records of one category, with the file and line each came from."""
    if category not in CATEGORIES:
        raise DataError(root, None, "categories", f"unknown or unsupported BFCL category {category!r}; the "
                        f"single-call Python ones are {', '.join(CATEGORIES)}")
    questions = root / f"{VERSION_PREFIX}_{category}.json"
    answers = root / "possible_answer" / f"{VERSION_PREFIX}_{category}.json"
    for path in (questions, answers):
        if not path.is_file():
            raise DataError(path, None, None, "missing (a BFCL data directory holds BFCL_v4_<category>.json and "
                            "possible_answer/BFCL_v4_<category>.json)")
    truth = dict(_rows(answers))
    for line, entry in _rows(questions):
        answer = truth.get(line)
        if answer is None:
            raise DataError(answers, line, "id", f"no possible answer for entry {entry.get('id')!r} (line {line})")
        yield questions, line, _record(questions, line, entry, answer, category)


def gold_only(record: QARecord) -> QARecord:
    """``record`` offering only its gold function (id ``<id>:gold``, ``meta.origin`` the question's
    id): a ``multiple`` question as a ``simple`` one, judged as such."""
    meta = record.meta
    gold = meta["calls"][0]["name"]
    category = "live_simple" if meta["category"].startswith("live_") else "simple_python"
    return replace(record, id=f"{record.id}:gold", hops=1, meta={
        **meta, "functions": [f for f in meta["functions"] if f["name"] == gold], "category": category,
        "origin": record.id, "offered": "gold"})


def _demonstrable(record: QARecord) -> bool:
    """Whether the checker accepts the record's canonical call (BFCL has a few gold entries no call
    can pass, e.g. a required argument with no accepted value: they are not demonstrated)."""
    meta = record.meta
    call = meta["calls"][0]
    return judge(meta["functions"], meta["ground_truth"], meta["category"], call["name"], call["arguments"]).valid


def convert(source: DataSource) -> tuple[list[QARecord], list[Document], dict[str, int]]:
    """``data.sources`` entry of format ``bfcl``: the records of ``source.categories`` (every
    usable one when empty), those over ``max_prompt_chars`` left out, and, from a ``train`` source,
    those whose gold call the checker rejects; the corpus is every function document they offer.
    Returns (records, corpus, {reason: records left out})."""
    from agentr1.data.records import check_record

    root = data_root(source.input)
    records, corpus, skipped = [], {}, {}
    for category in source.categories or CATEGORIES:
        for path, line, record in read_category(root, category):
            if source.functions == "gold":
                record = gold_only(record)
            if source.max_prompt_chars is not None and prompt_chars(
                    record.question, record.meta["functions"], record.meta.get("system")) > source.max_prompt_chars:
                skipped["max_prompt_chars"] = skipped.get("max_prompt_chars", 0) + 1
                continue
            if source.split == "train" and not _demonstrable(record):
                skipped["gold_call_rejected"] = skipped.get("gold_call_rejected", 0) + 1
                continue
            check_record(record, path, line)
            records.append(record)
            for f in record.meta["functions"]:
                doc = function_doc(f)
                corpus.setdefault(doc.id, doc)
    return records, list(corpus.values()), skipped
