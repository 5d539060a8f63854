"""Arithmetic word problems into records: SVAMP, MAWPS + ASDiv-A (the SVAMP paper's training set)
and GSM8K, each with its gold solution as calculator calls.

A solution is a list of steps, each one call ``calculate("a op b")`` and its value
(:func:`~agentr1.env.math_tool.calculator.format_number`): SVAMP's infix equations and MAWPS's
prefix ones are evaluated operator by operator, innermost first, each step's operands being
numbers of the problem or earlier steps' values as the tool writes them (or, with ``solution:
expression``, in one call of the whole equation, :func:`expression_of`); GSM8K's solutions carry
their steps as ``<<48/2=24>>`` annotations, taken as written. A record keeps them in ``meta``:
``calls`` (what the warm-up demonstrates, then the answer), ``gold_values`` (each step's value:
a call that returns one earns ``process_new_support``), ``equation`` (the source's own). Its
``answers`` is the last step's value (within :data:`REL_TOLERANCE` of the published answer),
``hops`` its number of operators (4: four or more, the schema's largest).

Input layouts (the files in ``../shared/realdata/`` and any file of the same layout, e.g. GSM8K's
test split): ``svamp`` a JSON list of ``{ID, Body, Question, Equation, Answer}``; ``mawps`` the
SVAMP repository's CSV (``Question`` with ``number0``, ``number1``... masks, ``Numbers``,
``Equation`` in prefix form over the masks, ``Answer``); ``gsm8k`` JSON lines of ``{question,
answer}``. A row that is not of its layout is a DataError naming the file, row and field. A
problem whose equation (or annotation) does not give its answer keeps its published answer and
no solution (``meta.unsolved``): it is evaluated like the others (a test set stays whole, as
published numbers count it), and left out, counted, from a ``train`` source.
"""
from __future__ import annotations

import ast
import copy
import csv
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from agentr1.data.records import (MAX_HOPS, DataError, Document, QARecord, check_record, iter_json_lines,
                                   source_file)
from agentr1.env.math_tool.calculator import OPERATORS, evaluate, format_number, parse_expression
from agentr1.env.tools import ToolError

if TYPE_CHECKING:
    from agentr1.config import DataSource

TOOL = "calculate"
REL_TOLERANCE = 1e-4
"""Two numbers are the same answer when they differ by at most this times max(1, |gold|): a
result the tool rounds to 6 decimals still matches; 51 and 51.01 do not."""
_SYMBOL = {v: k for k, v in OPERATORS.items()}
_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_MASK = re.compile(r"\bnumber(\d+)\b")


def same_number(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOLERANCE * max(1.0, abs(b))


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


class _Unsolvable(ValueError):
    """The gold equation cannot be turned into calls that give the answer."""


def steps_of(tree: ast.AST) -> tuple[list[tuple[str, str]], str]:
    """An equation's steps, innermost operator first: ``([(expression, value), ...], value of the
    whole)``; a bare number has no step."""
    steps: list[tuple[str, str]] = []

    def walk(node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return format_number(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return format_number(-float(walk(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOL:
            left, right = walk(node.left), walk(node.right)
            expression = f"{left} {_SYMBOL[type(node.op)]} {right}"
            try:
                value = format_number(evaluate(expression))
            except ToolError as err:
                raise _Unsolvable(f"step {expression!r}: {err}") from None
            steps.append((expression, value))
            return value
        raise _Unsolvable(f"unsupported part {ast.dump(node)[:60]}")

    return steps, walk(tree)


def expression_of(tree: ast.AST) -> str:
    """An equation as one expression, its numbers as the tool writes them and only the
    parentheses it needs (``( ( 10.0 - 3.0 ) - 5.0 )`` -> ``10 - 3 - 5``)."""
    class Numbers(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            text = format_number(node.value) if type(node.value) in (int, float) else None
            return ast.Name(text) if text is not None else node

    return ast.unparse(Numbers().visit(copy.deepcopy(tree)))


def _solution(tree: ast.AST, gold: float, solution: str) -> tuple[list[tuple[str, str]], str, int]:
    """The gold steps of ``tree`` (one per operator), or its one step (the whole equation), its
    value and its number of operators."""
    steps, value = _solved(tree, gold)
    if solution == "expression" and steps:
        expression = expression_of(tree)
        value = format_number(evaluate(expression))
        return [(expression, value)], value, len(steps)
    return steps, value, len(steps)


def prefix_tree(tokens: list[str]) -> ast.AST:
    """A prefix equation (``- number0 * number1 number2`` with the masks already replaced by
    numbers) as the syntax tree an infix one parses to."""
    position = 0

    def take() -> ast.AST:
        nonlocal position
        if position >= len(tokens):
            raise _Unsolvable("the prefix equation ends early")
        token = tokens[position]
        position += 1
        if token in OPERATORS:
            left = take()
            return ast.BinOp(left=left, op=OPERATORS[token](), right=take())
        value = _number(token)
        if value is None:
            raise _Unsolvable(f"unknown token {token!r} in the prefix equation")
        return ast.Constant(value)

    tree = take()
    if position != len(tokens):
        raise _Unsolvable("tokens left after the prefix equation")
    return tree


def _record(rid: str, question: str, steps: list[tuple[str, str]], answer: str, source: str, equation: str,
            path: Path, line: int | None, operators: int | None = None) -> QARecord:
    calls = [{"name": TOOL, "arguments": {"expression": e}} for e, _ in steps]
    meta = {"calls": calls, "gold_values": [v for _, v in steps] or [answer], "equation": equation}
    hops = len(steps) if operators is None else operators
    record = QARecord(rid, question, (answer,), (), max(1, min(hops, MAX_HOPS)), source, meta)
    check_record(record, path, line)
    return record


def _solved(tree: ast.AST, gold: float) -> tuple[list[tuple[str, str]], str]:
    steps, value = steps_of(tree)
    if not same_number(float(value), gold):
        raise _Unsolvable(f"the equation gives {value}, the answer is {format_number(gold)}")
    return steps, value


def _unsolved(rid: str, question: str, gold: float, source: str, equation: str, path: Path,
              line: int | None) -> QARecord:
    """A problem whose equation does not give its published answer: kept for evaluation (the
    answer is what every published number is scored against), with no solution to demonstrate."""
    record = _record(rid, question, [], format_number(gold), source, equation, path, line)
    record.meta.update(calls=[], unsolved=True)
    return record


def _field(row: dict, name: str, path: Path, line: int | None, where: str | None = None) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise DataError(path, line, where or name, f"expected a non-empty string, got {value!r:.40}")
    return value


def _answer(row: dict, name: str, path: Path, line: int | None, where: str | None = None) -> float:
    raw = row.get(name)
    value = raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else _number(str(raw or ""))
    if value is None:
        raise DataError(path, line, where or name, f"expected a number, got {raw!r:.40}")
    return float(value)


def read_svamp(path: Path, solution: str = "steps") -> Iterator[tuple[QARecord, str | None]]:
    """SVAMP's JSON list: each problem as ``(record, None)``, or ``(record without a solution,
    why)`` when its equation does not give its answer."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(path, None, None, f"cannot read a JSON list: {err}") from None
    if not isinstance(rows, list):
        raise DataError(path, None, None, f"expected a JSON list of problems, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        where = lambda f: f"[{i}].{f}"  # noqa: E731 - a JSON list has no lines: the index names the row
        if not isinstance(row, dict):
            raise DataError(path, None, f"[{i}]", f"expected an object, got {type(row).__name__}")
        rid, body = _field(row, "ID", path, None, where("ID")), _field(row, "Body", path, None, where("Body"))
        question = _field(row, "Question", path, None, where("Question"))
        equation, gold = _field(row, "Equation", path, None, where("Equation")), _answer(row, "Answer", path, None,
                                                                                       where("Answer"))
        text = f"{body.strip()} {question.strip()}"
        try:
            steps, value, operators = _solution(parse_expression(equation).body, gold, solution)
        except (_Unsolvable, ToolError) as err:
            yield _unsolved(f"svamp-{rid}", text, gold, "svamp", equation, path, None), f"equation: {err}"
            continue
        yield _record(f"svamp-{rid}", text, steps, value, "svamp", equation, path, None, operators), None


def read_mawps(path: Path, solution: str = "steps") -> Iterator[tuple[QARecord, str | None]]:
    """The SVAMP repository's masked CSV (MAWPS + ASDiv-A, or SVAMP in that form)."""
    try:
        handle = open(path, encoding="utf-8", newline="")
    except OSError as err:
        raise DataError(path, None, None, f"cannot read: {err.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("Question", "Numbers", "Equation", "Answer") if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(path, 1, missing[0], f"missing column (the header has {reader.fieldnames})")
        for row in reader:
            line = reader.line_num
            masked, equation = _field(row, "Question", path, line), _field(row, "Equation", path, line)
            numbers = [_number(n) for n in _field(row, "Numbers", path, line).split()]
            if any(n is None for n in numbers):
                raise DataError(path, line, "Numbers", f"expected numbers separated by spaces, got {row['Numbers']!r:.60}")
            gold = _answer(row, "Answer", path, line)
            def unmask(m: re.Match) -> str:
                k = int(m.group(1))
                if k >= len(numbers):
                    raise DataError(path, line, "Numbers", f"number{k} is masked but only {len(numbers)} numbers given")
                return format_number(numbers[k])

            question = " ".join(_MASK.sub(unmask, masked).split())
            question = re.sub(r" ([,.?!;:])", r"\1", question)  # the CSV's tokens "books ." -> "books."
            rid = f"mawps-{line}"
            try:
                steps, value, operators = _solution(prefix_tree(_MASK.sub(unmask, equation).split()), gold, solution)
            except (_Unsolvable, ToolError) as err:
                yield _unsolved(rid, question, gold, "mawps-asdiv-a", equation, path, line), f"equation: {err}"
                continue
            yield _record(rid, question, steps, value, "mawps-asdiv-a", equation, path, line, operators), None


def read_gsm8k(path: Path, solution: str = "steps") -> Iterator[tuple[QARecord, str | None]]:
    """GSM8K's JSON lines (train or test): the steps of every ``<<expression=value>>``."""
    for line, row, error in iter_json_lines(path):
        if error is not None:
            raise error
        if not isinstance(row, dict):
            raise DataError(path, line, None, f"expected a JSON object, got {type(row).__name__}")
        question, solution = _field(row, "question", path, line), _field(row, "answer", path, line)
        final = solution.rsplit("####", 1)
        gold = _number(final[1]) if len(final) == 2 else None
        if gold is None:
            raise DataError(path, line, "answer", "expected the solution to end with '#### <number>'")
        steps, rid, text = [], f"gsm8k-{line}", " ".join(question.split())
        try:
            for expression, written in _ANNOTATION.findall(solution):
                value = format_number(evaluate(expression.replace(",", "")))
                if _number(written) is None or not same_number(float(value), _number(written)):
                    raise _Unsolvable(f"<<{expression}={written}>> evaluates to {value}")
                steps.append((expression.replace(",", "").strip(), value))
            if not steps:
                raise _Unsolvable("no <<expression=value>> step")
        except (_Unsolvable, ToolError) as err:
            yield _unsolved(rid, text, gold, "gsm8k", "", path, line), f"annotation: {err}"
            continue
        yield _record(rid, text, steps, format_number(gold), "gsm8k", " ; ".join(e for e, _ in steps), path, line), None


READERS = {"svamp": read_svamp, "mawps": read_mawps, "gsm8k": read_gsm8k}

CALCULATOR_DOC = Document("calculate", "calculate", "The calculate tool evaluates arithmetic: numbers with + - * / "
                          "and parentheses, e.g. (76 - 25) * 3. Results are written as integers or with at most "
                          "six decimals.")
"""The corpus of a word-problem dataset: the one document the agent's tool comes with (every
dataset has a corpus; the calculator searches nothing)."""


def converter(fmt: str):
    """The ``data.sources`` converter of ``fmt`` (svamp, mawps, gsm8k)."""
    def convert(source: DataSource) -> tuple[list[QARecord], list[Document], dict[str, int]]:
        path = source_file(source)
        if fmt == "gsm8k" and source.solution != "steps":
            raise DataError(path, None, "solution", "gsm8k solutions are their annotated steps: "
                            "solution: steps")
        records, skipped = [], {}
        for record, why in READERS[fmt](Path(path), source.solution):
            if why is not None and source.split == "train":  # nothing to demonstrate: left out of training
                skipped[why.split(":")[0]] = skipped.get(why.split(":")[0], 0) + 1
            elif source.max_calls is not None and len(record.meta["calls"]) > source.max_calls:
                skipped["max_calls"] = skipped.get("max_calls", 0) + 1
            elif source.max_prompt_chars is not None and len(record.question) > source.max_prompt_chars:
                skipped["max_prompt_chars"] = skipped.get("max_prompt_chars", 0) + 1
            else:
                records.append(record)
        if not records:
            raise DataError(path, None, None, f"no {fmt} problems found ({skipped or 'empty'})")
        return records, [CALCULATOR_DOC], skipped

    convert.__name__ = f"convert_{fmt}"
    return convert


convert_svamp, convert_mawps, convert_gsm8k = (converter(f) for f in READERS)
