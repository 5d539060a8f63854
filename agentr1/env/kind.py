"""What an environment kind and a tool are to the registry: the records that describe them.

Each built-in kind's package (``agentr1.env.qa``, ``sql``, ``mixed``, ``function_call``,
``math_tool``) declares its :class:`EnvKind` (builder, generator, converters, record rules) and
its :class:`ToolEntry`s, naming its heavy modules as "module:function" strings so that
nothing is imported until a run needs it; ``agentr1.env.registry`` collects them and takes
plug-ins' registrations beside them. The record rules shared by several kinds live here too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from agentr1.config import Config
    from agentr1.env.base import Environment


@dataclass(frozen=True)
class RecordRule:
    """What a record of an environment kind must satisfy beyond the shared QA schema (the Great
    Expectations suite ``env_<kind>`` checks it on the raw rows, ``adapters/validation.py``)."""

    name: str
    rule: str
    """What must hold, in words."""
    field: str
    """The field a person fixes."""
    problems: Callable[[dict], int]
    """How many problems a raw JSON row has (0: it holds)."""
    splits: tuple[str, ...] = ("train",)
    """The splits it applies to (demonstrations are played on train only)."""


def gold_calls_problems(row: dict) -> int:
    calls = row.get("calls")
    if not isinstance(calls, list) or not calls:
        return 1
    return sum(not (isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict))
               for c in calls)


def gold_values_problems(row: dict) -> int:
    values = row.get("gold_values")
    if not isinstance(values, list) or not values:
        return 1
    return sum(not (isinstance(v, str) and v.strip()) for v in values)


GOLD_CALLS_RULE = RecordRule("gold_calls", 'a train record has gold calls: "calls": [{"name": <tool>, '
                             '"arguments": {...}}, ...], which the warm-up demonstrates', "calls", gold_calls_problems)


@dataclass(frozen=True)
class EnvKind:
    name: str
    build: Callable[..., Environment] | str
    """``build(cfg, data_dir, tools)``, or "module:function" resolved on first use (built-ins stay
    unimported until a run needs them)."""
    tools: tuple[str, ...] = ()
    """Registered tools the environment always has (beside the config's ``env.tools``; ``qa``
    builds its search tool itself, over the index it also reads document titles from)."""
    synth: Callable[[Config], tuple[dict, list]] | str | None = None
    description: str = ""
    record_rules: tuple[RecordRule, ...] = ()
    converters: dict[str, Callable | str] = field(default_factory=dict)
    """Input formats this kind's data is converted from (``data.sources``, ``agentr1 data convert
    --format``): format -> ``convert(source: DataSource) -> (records, corpus, {reason: left out})``."""


@dataclass(frozen=True)
class ToolEntry:
    name: str
    make: Callable[..., Any] | str
    """The tool callable, or with ``factory`` a ``factory(cfg, data_dir) -> callable``: ``data_dir`` is
    the dataset directory, or a served model's copy of its resources (the same file names)."""
    factory: bool = False
    network: bool = False
    """The tool opens sockets: its sandbox worker allows them."""
