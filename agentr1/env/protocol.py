"""The tool-call protocol: how an assistant turn is written and read.

A turn is an optional ``<think>...</think>`` prefix followed by exactly one action:

    <tool_call>{"name": "search", "arguments": {"query": "Zorvak Pellin"}}</tool_call>
    <answer>Kelmora</answer>

This is the Hermes/Qwen2.5 convention, so a pretrained Qwen2.5 instruct model and the
from-scratch model speak the same format. ``parse_turn`` never raises: whatever the policy
samples becomes a ``ParsedTurn``, and a malformed turn carries a short error text that the
environment sends back as the observation (the agent can read it and retry). Given the
environment's tools (name -> JSON-schema ``parameters``, see ``agentr1.env.tools``), it also
checks the call's tool name and its arguments against that schema.

Everything a ``ParsedTurn`` carries can be encoded: an error quotes the policy's own text only
as an ``excerpt`` (short, printable, no ``<``/``>`` so no chat special token or protocol tag can
form in the observation), and the query and answer pass through ``encodable`` (a JSON escape
such as ``"\\udfff"`` decodes to a lone surrogate, which no tokenizer or UTF-8 writer accepts).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ANSWER_START = "<answer>"
ANSWER_END = "</answer>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
THINK_START = "<think>"
THINK_END = "</think>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
EOS = "<|endoftext|>"
# Generation stops at the end of an action; the tokenizer's EOS / IM_END are added by the engine.
STOP_STRINGS = (TOOL_CALL_END, ANSWER_END)

SEARCH_TOOL_NAME = "search"
DEFAULT_MAX_QUERY_CHARS = 200
"""Longest string argument a call may carry (the config's ``env.max_query_chars``)."""
# Chat-end markers a sampler may leave at the end of a turn; they carry no meaning for the action.
_TRAILING_MARKERS = (IM_END, EOS)
# Protocol markup that never belongs inside an answer (the <tool_call>/<answer> tags are
# caught earlier, as a second block).
_MARKUP = (THINK_START, THINK_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END, IM_START, IM_END, EOS)

# Longest piece of policy text an error message quotes back: enough to recognise the mistake,
# too short to smuggle a prompt into the observation.
EXCERPT_CHARS = 40
REPLACEMENT_CHAR = "\ufffd"
_SURROGATES = re.compile("[\ud800-\udfff]")
# Angle brackets become look-alike quotes in excerpts: every chat special token of the
# from-scratch and Qwen2.5 vocabularies (<|im_start|>, <tool_call>, <pad>, ...) needs one.
_INERT_BRACKETS = str.maketrans({"<": "\u2039", ">": "\u203a"})
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}

TurnKind = Literal["tool_call", "answer", "invalid"]


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn, read.

    Exactly one of ``name`` with ``arguments`` (kind "tool_call"), ``answer`` (kind "answer") or
    ``error`` (kind "invalid") is set; ``error`` is a readable message starting with "Error:".
    """

    kind: TurnKind
    name: str | None = None
    arguments: dict | None = None
    answer: str | None = None
    error: str | None = None

    @property
    def query(self) -> str | None:
        """The ``query`` argument of a call (the search tool's one argument), else None."""
        return self.arguments.get("query") if self.arguments else None


def encodable(text: str) -> str:
    """``text`` with every surrogate code point (what a lone ``\\udxxx`` JSON escape decodes to)
    replaced by U+FFFD, so it encodes to UTF-8 and tokenizes; other text is unchanged."""
    return _SURROGATES.sub(REPLACEMENT_CHAR, text)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """A short, inert quote of policy text for an error message: at most ``limit`` characters
    (then "..."), each non-printable one (lone surrogate, control, newline, format or unassigned
    character) as U+FFFD, and ``<``/``>`` as ``\u2039``/``\u203a``."""
    cut = "".join(c if c.isprintable() else REPLACEMENT_CHAR for c in text[:limit])
    return cut.translate(_INERT_BRACKETS) + ("..." if len(text) > limit else "")


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _invalid(message: str) -> ParsedTurn:
    return ParsedTurn(kind="invalid", error=f"Error: {message}")


def _bad_call(message: str) -> ParsedTurn:
    return _invalid(f"invalid tool call: {message}")


def hermes_tools_block(tools: list[dict]) -> str:
    """The tool section Qwen2.5's chat template appends to the system message (Hermes format),
    for templates that ignore ``tools=`` (the chat format's ``tools_in_system``) and for
    records that bring their own functions (the ``function_call`` environment): the same text
    BFCL's Qwen function-calling handler writes."""
    listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{listed}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def format_call(name: str, arguments: dict) -> str:
    """The canonical tool-call action (what demonstrations contain)."""
    call = {"name": name, "arguments": arguments}
    return f"{TOOL_CALL_START}{json.dumps(call, ensure_ascii=False)}{TOOL_CALL_END}"


def format_tool_call(query: str) -> str:
    """The canonical call of the search tool for ``query``."""
    return format_call(SEARCH_TOOL_NAME, {"query": query})


def format_answer(answer: str) -> str:
    return f"{ANSWER_START}{answer}{ANSWER_END}"


def format_tool_response(body: str) -> str:
    """The wrapper the chat template puts around a tool message's body."""
    return f"{TOOL_RESPONSE_START}\n{body}\n{TOOL_RESPONSE_END}"


def parse_turn(text: str, tools: Mapping[str, dict] | None = None,
               max_query_chars: int = DEFAULT_MAX_QUERY_CHARS) -> ParsedTurn:
    """Read one assistant turn; never raises.

    Rules: surrounding whitespace and trailing ``<|im_end|>``/``<|endoftext|>`` are ignored;
    an optional ``<think>...</think>`` prefix is skipped (its content is opaque); what remains
    must be exactly one ``<tool_call>`` block or one non-empty ``<answer>`` block, with no
    other text. A call must name one of ``tools`` (name -> JSON-schema ``parameters``) with
    arguments that fit its schema, string arguments at most ``max_query_chars`` long; with
    ``tools`` None any name and argument object passes (reading a transcript's structure).
    Anything else is kind "invalid" with an error message for the agent.
    """
    try:
        return _parse_action(_strip_think(_strip_markers(text)), tools, max_query_chars)
    except _TurnError as err:
        return _invalid(str(err))
    except Exception as err:  # noqa: BLE001 - a sampled turn must never crash the rollout
        return _invalid(f"could not parse the turn ({type(err).__name__})")


class _TurnError(ValueError):
    """A structural problem in the turn; the message is shown to the agent."""


def _strip_markers(text: str) -> str:
    text = text.strip()
    stripped = True
    while stripped:
        stripped = False
        for marker in _TRAILING_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                stripped = True
    return text


def _strip_think(text: str) -> str:
    if not text.startswith(THINK_START):
        return text
    end = text.find(THINK_END)
    if end < 0:
        raise _TurnError(f"unclosed {THINK_START} (missing {THINK_END})")
    return text[end + len(THINK_END):].strip()


def _parse_action(text: str, tools: Mapping[str, dict] | None, max_query_chars: int) -> ParsedTurn:
    has_call = TOOL_CALL_START in text or TOOL_CALL_END in text
    has_answer = ANSWER_START in text or ANSWER_END in text
    if has_call and has_answer:
        raise _TurnError(f"a turn holds either one {TOOL_CALL_START} or one {ANSWER_START}, not both")
    if has_call:
        return _parse_call(_block_body(text, TOOL_CALL_START, TOOL_CALL_END), tools, max_query_chars)
    if has_answer:
        answer = _block_body(text, ANSWER_START, ANSWER_END).strip()
        if not answer:
            raise _TurnError(f"empty {ANSWER_START}")
        if any(tag in answer for tag in _MARKUP):
            raise _TurnError(f"markup inside {ANSWER_START}")
        return ParsedTurn(kind="answer", answer=encodable(answer))
    raise _TurnError(f"no {TOOL_CALL_START} or {ANSWER_START} found")


def _block_body(text: str, start: str, end: str) -> str:
    """The content of the single ``start...end`` block that must make up all of ``text``."""
    n_start, n_end = text.count(start), text.count(end)
    if n_start > 1 or n_end > 1:
        raise _TurnError(f"only one {start} block is allowed per turn")
    if n_start == 0:
        raise _TurnError(f"{end} without {start}")
    if n_end == 0:
        raise _TurnError(f"unclosed {start} (missing {end})")
    i, j = text.index(start), text.index(end)
    if j < i:
        raise _TurnError(f"{end} before {start}")
    if i > 0:
        raise _TurnError(f"unexpected text before {start}")
    if j + len(end) < len(text):
        raise _TurnError(f"unexpected text after {end}")
    return text[i + len(start): j]


def _parse_call(body: str, tools: Mapping[str, dict] | None, max_query_chars: int) -> ParsedTurn:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return _bad_call(f"not valid JSON ({err.msg})")
    except RecursionError:
        return _bad_call("nested too deeply")
    if not isinstance(call, dict):
        return _bad_call('expected a JSON object {"name": ..., "arguments": {...}}')
    problem = _key_problem(call, {"name", "arguments"}, "")
    if problem:
        return _bad_call(problem)
    name = call["name"]
    if not isinstance(name, str):
        return _bad_call(f"name must be a string, got {_json_type(name)}")
    if tools is not None and name not in tools:
        return _bad_call(f"unknown tool '{excerpt(name)}' (available: {', '.join(tools)})")
    args = call["arguments"]
    if not isinstance(args, dict):
        return _bad_call("arguments must be a JSON object")
    if tools is not None:
        problem = argument_problem(args, tools[name], max_query_chars)
        if problem:
            return _bad_call(problem)
    return ParsedTurn(kind="tool_call", name=name, arguments=_encodable_values(args))


# The tools' argument schemas (agentr1/env/tools.py) as the parser checks them
_SCHEMA_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}
_TYPE_WORDS = {"string": "a non-empty string", "integer": "an integer", "number": "a number",
               "boolean": "true or false", "array": "an array", "object": "an object", "null": "null"}


MAX_ARGUMENT_DEPTH = 32
"""Nesting an argument may have: deeper JSON is refused as a bad call (a serializer such as the
MCP SDK's pydantic fails near 255 levels, which would look like a dead server)."""


def _value_problem(value: Any, schema: dict, where: str, max_chars: int, depth: int = 0) -> str | None:
    if "type" not in schema and not schema.get("nullable"):  # JSON Schema's {}: any JSON value (MCP tools)
        return _json_problem(value, where, depth, max_chars)
    types = schema.get("type", "string")
    types = [types] if isinstance(types, str) else list(types)
    if schema.get("nullable"):
        types.append("null")
    ok = [t for t in types if isinstance(value, _SCHEMA_TYPES.get(t, ()))
          and not (t in ("integer", "number") and isinstance(value, bool))]
    if not ok:
        return f"{where} must be " + " or ".join(_TYPE_WORDS.get(t, t) for t in types)
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number"
    if isinstance(value, str):
        if not value.strip():
            return f"{where} must be a non-empty string"
        if len(value) > max_chars:
            return f"{where} is longer than {max_chars} characters"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {', '.join(map(str, schema['enum']))}"
    if isinstance(value, list):
        if len(value) > max_chars:
            return f"{where} has more than {max_chars} items"
        for i, item in enumerate(value):
            problem = _value_problem(item, schema.get("items", {}), f"{where}[{i}]", max_chars, depth + 1)
            if problem:
                return problem
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if len(value) > max_chars:
            return f"{where} has more than {max_chars} items"
        for key, item in value.items():
            if key not in props and len(str(key)) > max_chars:
                return f"{where} has a key longer than {max_chars} characters"
            inner = f"{where}.{excerpt(str(key))}"
            problem = (_value_problem(item, props[key], inner, max_chars, depth + 1) if key in props
                       else _json_problem(item, inner, depth + 1, max_chars))
            if problem:
                return problem
    return None


def _json_problem(value: Any, where: str, depth: int, max_chars: int) -> str | None:
    """What no tool can take in a free-form value (a schema of ``{}``, an object's undeclared
    keys): a non-finite number (JSON has none), nesting deeper than :data:`MAX_ARGUMENT_DEPTH`,
    and, as for every declared argument, a string (a key too) longer than ``max_chars`` or a list
    or object of more items."""
    if depth > MAX_ARGUMENT_DEPTH:
        return f"{where} is nested more than {MAX_ARGUMENT_DEPTH} levels deep"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number"
    if isinstance(value, str) and len(value) > max_chars:
        return f"{where} is longer than {max_chars} characters"
    if isinstance(value, (dict, list)) and len(value) > max_chars:
        return f"{where} has more than {max_chars} items"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and len(key) > max_chars:
            return f"{where} has a key longer than {max_chars} characters"
        problem = _json_problem(item, f"{where}.{excerpt(str(key))}" if isinstance(value, dict) else f"{where}[{key}]",
                                depth + 1, max_chars)
        if problem:
            return problem
    return None


def argument_problem(arguments: dict, parameters: dict, max_chars: int) -> str | None:
    """Why ``arguments`` do not fit the tool's ``parameters`` schema (missing, extra or mistyped
    argument; a string longer than ``max_chars``), or None. Messages quote only field names."""
    props = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing field arguments.{missing[0]}"
    extra = sorted(str(k) for k in arguments if k not in props)
    if extra:
        return f"unexpected field arguments.{excerpt(extra[0])}"
    for key, value in arguments.items():
        problem = _value_problem(value, props[key], f"arguments.{key}", max_chars)
        if problem:
            return problem
    return None


def _encodable_values(value):
    """``value`` with every string in it passed through :func:`encodable`."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, list):
        return [_encodable_values(v) for v in value]
    if isinstance(value, dict):
        return {encodable(str(k)): _encodable_values(v) for k, v in value.items()}
    return value


def _key_problem(obj: dict, expected: set[str], prefix: str) -> str | None:
    missing = sorted(expected - obj.keys())
    if missing:
        return f"missing field {prefix}{missing[0]}"
    extra = sorted(str(k) for k in obj.keys() - expected)
    if extra:
        return f"unexpected field {prefix}{excerpt(extra[0])}"
    return None
