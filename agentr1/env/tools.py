"""Tools as plain Python callables: a typed, documented function is a tool.

A tool is a function (or a small class with a documented ``__call__``, for tools that hold
state or a batched backend, like the search index) whose type hints and Google-style docstring
describe its arguments. Its JSON schema comes from transformers' ``get_json_schema``, the
schema ``apply_chat_template(tools=...)`` renders into the prompt (Hermes/Qwen format), and the
turn parser checks the model's arguments against it (:func:`agentr1.env.protocol.argument_problem`), so a wrong type,
a missing or an extra argument is an error observation for the agent, never an exception::

    def convert(value: float, unit: str) -> str:
        '''Convert a length to metres.

        Args:
            value: The number to convert.
            unit: Its unit (choices: ["km", "cm", "mi"]).
        '''
        return f"{value * FACTORS[unit]:g} m"

    tool = Tool.from_callable(convert)

A tool returns text (the observation) or a :class:`ToolOutput` (text plus the keys of what it
found, e.g. document ids, which the environment compares with a record's gold items for the
process reward). A class may also define ``batch(calls: list[dict]) -> list[output]`` to answer
one turn's calls of a whole rollout batch at once (one BM25 query batch for all episodes).

Model-written arguments are hostile input: :meth:`Tool.run_batch` catches whatever the tool
raises and turns it into an error observation (``Error: tool 'x' failed: ...``) quoting at most
a short, inert excerpt; the environment counts it and applies the bad-call penalty.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

from transformers.utils import get_json_schema

from agentr1.env.protocol import encodable, excerpt

# JSON-schema type name -> the Python types a parsed JSON value of that type has.
class ToolDefinitionError(ValueError):
    """A tool that cannot be described to the model (no type hints, no docstring, bad name)."""


class ToolError(Exception):
    """Raised by a tool for a failure the agent should read (its message becomes the
    observation, e.g. "no such unit"); any other exception is reported by its type only."""


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call returned: the observation ``text``, and the ``keys`` of what it found
    (e.g. document ids), which the environment matches against a record's gold items."""

    text: str
    keys: tuple[str, ...] = ()


def _as_output(value: Any) -> ToolOutput:
    """A tool's return value as its observation: text, a ToolOutput, a number or a bool as written,
    a list or dict as JSON. Anything else (None, a set, bytes, an object) is a ToolError naming its
    type: a tool that returns it has a bug the agent should not be paid for reading around."""
    if isinstance(value, ToolOutput):
        if not isinstance(value.text, str):
            raise ToolError(f"it returned a ToolOutput whose text is a {type(value.text).__name__}, not a str")
        return ToolOutput(encodable(value.text), tuple(str(k) for k in value.keys))
    if isinstance(value, (str, bool, int, float)):
        return ToolOutput(encodable(str(value)))
    if isinstance(value, (list, dict)):
        try:
            return ToolOutput(encodable(json.dumps(value, ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError) as err:
            raise ToolError(f"it returned a {type(value).__name__} that is not JSON: {err}") from None
    raise ToolError(f"it returned a {type(value).__name__}; a tool returns text, a number, a list or dict "
                    "(as JSON) or a ToolOutput")


@dataclass(frozen=True)
class Tool:
    """A named callable with the JSON schema the model sees (``{"type": "function", ...}``)."""

    name: str
    schema: dict
    fn: Callable[..., Any]
    batch: Callable[[list[dict]], Sequence[Any]] | None = None
    make: Callable[[], Any] | None = None
    """Builds the tool's callable anew, in a sandboxed worker (``agentr1.env.sandbox``), so that it
    opens its own files there; None: the worker uses the object it inherits."""
    network: bool = False
    """The tool opens sockets (its sandbox worker allows them; every other tool's refuses them)."""
    isolated: ClassVar[bool] = False
    """True for a tool whose calls already run in a process of their own (an MCP server's): it
    gets no sandbox worker around it."""

    @classmethod
    def from_callable(cls, fn: Callable[..., Any], name: str | None = None,
                      make: Callable[[], Any] | None = None) -> "Tool":
        """The tool ``fn`` describes: its schema from its signature and docstring. ``fn`` may be an
        object whose class documents ``__call__`` (its ``name`` attribute, else the class name in
        lower case, names the tool) and may define ``batch``. ToolDefinitionError names what is
        missing (a type hint, the docstring, an argument's description)."""
        target = fn if callable(fn) and hasattr(fn, "__name__") else getattr(fn, "__call__", None)
        if target is None or not callable(fn):
            raise ToolDefinitionError(f"a tool must be a function or an object with __call__, got {type(fn).__name__}")
        label = getattr(fn, "__qualname__", None) or type(fn).__name__
        try:
            schema = get_json_schema(target)
        except Exception as err:  # transformers' TypeHintParsingException / DocstringParsingException
            raise ToolDefinitionError(f"tool {label}: {err}. A tool needs a type hint on every argument and a "
                                      "Google-style docstring (a description, then 'Args:' with one line per "
                                      "argument)") from err
        function = schema["function"]
        function.pop("return", None)  # the model sees what to send, not the Python return type
        function["name"] = name or getattr(fn, "name", None) or (
            function["name"] if function["name"] != "__call__" else type(fn).__name__.lower())
        if not valid_tool_name(function["name"]):
            raise ToolDefinitionError(f"tool {label}: name {function['name']!r} must be letters, digits, _ or -")
        # The parser refuses arguments the schema does not name; say so to the model too.
        function["parameters"]["additionalProperties"] = False
        batch = getattr(fn, "batch", None)
        return cls(function["name"], schema, fn, batch if callable(batch) else None, make)

    @property
    def parameters(self) -> dict:
        return self.schema["function"]["parameters"]

    def prompt_schema(self) -> dict:
        """A copy of the schema for ``apply_chat_template(tools=...)``."""
        return copy.deepcopy(self.schema)

    def scaffold(self) -> tuple[str, str]:
        """The fixed text of a call around its first argument's value, tags excluded, e.g.
        ``('{"name": "search", "arguments": {"query": "', '"}}')`` for a one-string tool (the
        quotes of a string value included). A from-scratch tokenizer makes each one token
        (``models.tokenizer.build_tokenizer``)."""
        from agentr1.env.protocol import TOOL_CALL_END, TOOL_CALL_START, format_call

        props = self.parameters.get("properties", {})
        if not props:
            return format_call(self.name, {})[len(TOOL_CALL_START):-len(TOOL_CALL_END)], ""
        first, spec = next(iter(props.items()))
        sentinel = "ARGSENTINEL" if spec.get("type") == "string" else 987654321
        body = format_call(self.name, {first: sentinel})[len(TOOL_CALL_START):-len(TOOL_CALL_END)]
        before, after = body.split(str(sentinel))
        return before, after

    def run_batch(self, calls: list[dict]) -> list[tuple[ToolOutput, bool]]:
        """Run ``calls`` (validated argument dicts); per call its output and whether it failed.
        Never raises: a raising tool gives an error output for each call it was to answer."""
        if not calls:
            return []
        if self.batch is not None:
            try:
                results = list(self.batch(calls))
                if len(results) != len(calls):
                    raise ToolError(f"batch returned {len(results)} results for {len(calls)} calls")
                return [(_as_output(r), False) for r in results]
            except Exception as err:  # noqa: BLE001 - a tool must never crash a rollout
                return [(self.failure(err), True)] * len(calls)
        out = []
        for args in calls:
            try:
                out.append((_as_output(self.fn(**args)), False))
            except Exception as err:  # noqa: BLE001 - a tool must never crash a rollout
                out.append((self.failure(err), True))
        return out

    def failure(self, err: Exception) -> ToolOutput:
        """The observation of a failed call: a ToolError's message, any other error's type."""
        detail = excerpt(str(err), 120) if isinstance(err, ToolError) else type(err).__name__
        return ToolOutput(f"Error: tool '{self.name}' failed: {detail}")


def valid_tool_name(name: str) -> bool:
    """A tool name is letters, digits, ``_`` or ``-`` (what the agent's call format names)."""
    return bool(name) and name.replace("_", "").replace("-", "").isalnum()


def check_unique(tools: Sequence[Tool]) -> None:
    names = [t.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolDefinitionError(f"two tools are named {dupes[0]!r}; tool names must be unique")
