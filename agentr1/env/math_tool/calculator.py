"""The ``calculate`` tool: arithmetic on numbers, evaluated safely, and the one number format.

An expression is parsed with Python's ``ast`` module and evaluated by walking the tree; nothing is
``eval``-ed and only these nodes are allowed: number literals, ``+ - * / // % **``, unary ``+ -``
and parentheses. Bounds keep one call cheap whatever the policy writes: :data:`MAX_CHARS`
characters, :data:`MAX_NODES` nodes, :data:`MAX_DEPTH` levels, exponents up to
:data:`MAX_EXPONENT` and every intermediate value within :data:`MAX_MAGNITUDE`. A call outside
them, a division by zero or anything else is a :class:`~agentr1.env.tools.ToolError` the agent
reads. (The tool also runs in the sandbox's worker like every tool: those bounds are the second
line.)

:func:`format_number` is the one way a number is written: by the tool's result, by the
demonstrations' expressions and answers, and by the converters' gold values, so a result the
agent copies matches a gold value as text.
"""
from __future__ import annotations

import ast
import math
import operator

from agentr1.env.tools import ToolError, ToolOutput

MAX_CHARS = 200
"""Longest expression (the environment's ``env.max_query_chars`` bounds a call's arguments too)."""
MAX_NODES = 64
MAX_DEPTH = 16
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e15
"""Largest absolute value of any intermediate result (well past every benchmark's numbers)."""
DECIMALS = 6
"""Digits after the point a non-integer result keeps."""

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
OPERATORS = {"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div}
"""The four operators of the benchmarks' gold equations, by symbol."""


def format_number(value: float) -> str:
    """``value`` as the tool writes it: an integer without a point (``51``), else at most
    :data:`DECIMALS` decimals without trailing zeros (``2.333333``, ``0.2``)."""
    if not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    rounded = round(float(value), DECIMALS)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.{DECIMALS}f}".rstrip("0").rstrip(".")


def _check(value: float) -> float:
    if isinstance(value, complex):  # a negative number to a fractional power
        raise ToolError("the result is not a real number")
    # An int is compared as it is (a 300-digit literal does not fit a float)
    if abs(value) > MAX_MAGNITUDE or (isinstance(value, float) and not math.isfinite(value)):
        raise ToolError(f"a value beyond {MAX_MAGNITUDE:g} in magnitude")
    return value


def _walk(node: ast.AST, depth: int) -> float:
    if depth > MAX_DEPTH:
        raise ToolError(f"nested more than {MAX_DEPTH} levels")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_walk(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, depth + 1), _walk(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or (left == 0 and right < 0)):
            raise ToolError(f"an exponent beyond {MAX_EXPONENT}, or 0 to a negative power")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        if isinstance(node.op, ast.Pow) and abs(left) > 1 and abs(right) * math.log10(abs(left)) > 15:
            raise ToolError(f"a value beyond {MAX_MAGNITUDE:g} in magnitude")
        return _check(_BINARY[type(node.op)](left, right))
    raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


def parse_expression(expression: str) -> ast.Expression:
    """The expression's syntax tree, checked for size; ToolError saying what is wrong."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("an empty expression")
    if len(expression) > MAX_CHARS:
        raise ToolError(f"an expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError("not an arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"more than {MAX_NODES} parts")
    return tree


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression (module docstring); ToolError otherwise."""
    return _walk(parse_expression(expression).body, 0)


def calculate(expression: str) -> ToolOutput:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers with + - * / ( ), e.g. "(76 - 25) * 3".
    """
    value = format_number(evaluate(expression))
    return ToolOutput(value, (value,))
