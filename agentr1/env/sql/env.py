"""The ``sql`` environment: answer a question by querying the dataset's SQLite database.

``SQLEnv`` is the tool-use environment (``agentr1.env.base.ToolEnv``: parsing, rewards, episode
metrics) with the ``sql`` tool (``agentr1.env.sql.tool``) and any extra ``env.tools``. Rewards:
``process_valid_call`` for a query that ran, ``process_new_support`` the first time a result
shows a value of the record's gold chain (``meta["gold_values"]``: each hop's value, the answer
last), the bad-call penalty for a malformed call or a query SQLite refused, and the outcome
(EM/F1) of the answer, as in QA.

Demonstrations (``demonstrator``): on generated questions (``meta["chain"]``,
``agentr1.env.sql.synth``) a scripted expert that writes each hop's look-up with the value it
read from the previous result, with the QA expert's systematic mistakes
(``agents.ExpertNoise``): usually one hop short on 3-hop questions, sometimes the distractor
column (``producer`` for ``director``; the wrong value leads on through its own row),
sometimes a malformed call first. Without mistakes it is the oracle (EM 1.0, tested). Records
without a chain but with gold calls (``meta["calls"]``) are demonstrated by those.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from agentr1.data.records import DataError, QARecord
from agentr1.env.sql.synth import TABLES, lookup_query, schema_docs
from agentr1.env.agents import (
    UNKNOWN_ANSWER,
    ExpertNoise,
    NoisyExpertAgent,
    PerRecordAgent,
    _malformed_call,
    _progress,
    read_relation,
)
from agentr1.env.base import EnvSettings, ToolEnv
from agentr1.env.protocol import SEARCH_TOOL_NAME, format_answer, format_call, parse_turn
from agentr1.env.rewards import RewardWeights
from agentr1.env.sql.tool import CELL_SEP, SQL_TOOL_NAME
from agentr1.env.tools import Tool

if TYPE_CHECKING:
    from agentr1.config import ExpertConfig
    from agentr1.env.agents import ScriptedAgent

SYSTEM_PROMPT = (
    "Answer the question by querying an SQLite database. To query, write "
    '<tool_call>{"name": "sql", "arguments": {"query": "SELECT ..."}}</tool_call> and read the rows. '
    "Look up one value at a time and use it in the next query. When you know the answer, write it as "
    "<answer>...</answer>. The tables:\n" + "\n".join(d.text for d in schema_docs())
)
_CHAIN_FIELDS = ("table", "key", "subject", "column", "distractor_column")


def first_value(observation: str | None) -> str | None:
    """The first cell of the first row of an ``sql`` result (None: no rows, or an error)."""
    lines = (observation or "").split("\n")
    if len(lines) < 2 or observation.startswith("Error") or lines[1].startswith("("):
        return None
    return lines[1].split(CELL_SEP)[0]


def lookup_phrases() -> list[str]:
    """The start of every column's look-up (``SELECT director FROM films WHERE title = '``): one
    token each for a scratch tokenizer, beside the tools' call text."""
    return [lookup_query(t.name, t.key, c, "")[:-1] for t in TABLES.values() for c in t.columns]


def hop_call(hop: dict, subject: str, distracted: bool) -> str:
    """The call of one hop for ``subject``: its look-up (the distractor column when
    ``distracted``), or for a search hop (the mixed world) a search of ``subject``."""
    if hop.get("tool") == SEARCH_TOOL_NAME:
        return format_call(SEARCH_TOOL_NAME, {"query": subject})
    column = hop["distractor_column"] if distracted else hop["column"]
    return format_call(SQL_TOOL_NAME, {"query": lookup_query(hop["table"], hop["key"], column, subject)})


def read_hop(hop: dict, observation: str | None, query: str | None, distracted: bool) -> str | None:
    """The value a hop's result gives: the first cell of the rows (a distracted query already
    chose its column), or for a search hop the document's relation (the distractor's when
    ``distracted``)."""
    if hop.get("tool") == SEARCH_TOOL_NAME:
        return read_relation(observation, query, hop["distractor_relation"] if distracted else hop["relation"])
    return first_value(observation)


@dataclass
class SQLExpertAgent:
    """Plays each hop of ``meta["chain"]`` with its tool (``sql``, or ``search`` for a mixed
    world's document hops), each value read from the last result, with ``noise``'s mistakes
    (module docstring); ``ExpertNoise(0, 0, 0)`` is the oracle."""

    noise: ExpertNoise = field(default_factory=ExpertNoise)

    def act(self, record: QARecord, messages: list[dict]) -> str:
        chain = record.meta["chain"]
        plan = NoisyExpertAgent(self.noise).plan(record)  # the same draws as the QA expert's
        progress = _progress(messages, (SQL_TOOL_NAME, SEARCH_TOOL_NAME))
        hop = progress.hop
        if hop == 0:
            turn = hop_call(chain[0], chain[0]["subject"], plan.distractor[0])
        else:
            value = read_hop(chain[hop - 1], progress.last_observation, progress.last_query, plan.distractor[hop - 1])
            if value is None:
                return format_answer(UNKNOWN_ANSWER)
            if hop >= len(chain) or (plan.stop_short and hop == len(chain) - 1):
                return format_answer(value)
            turn = hop_call(chain[hop], value, plan.distractor[hop])
        variant = plan.malformed[hop]
        if variant is not None and progress.retries == 0:
            parsed = parse_turn(turn)
            return _malformed_call(variant, parsed.arguments["query"], parsed.name)
        return turn


def oracle() -> SQLExpertAgent:
    return SQLExpertAgent(ExpertNoise(stop_short_3hop=0.0, distractor=0.0, malformed=0.0))


def _chain_problem(chain) -> str | None:
    if not isinstance(chain, list) or not chain:
        return "meta.chain must be a non-empty list of hops"
    for k, hop in enumerate(chain):
        if not isinstance(hop, dict) or not all(isinstance(hop.get(f), str) for f in _CHAIN_FIELDS):
            return f"meta.chain[{k}] must hold the strings {', '.join(_CHAIN_FIELDS)}"
        table = next((t for t in TABLES.values() if t.name == hop["table"]), None)
        if table is None or hop["key"] != table.key or not {hop["column"], hop["distractor_column"]} <= set(table.columns):
            return f"meta.chain[{k}]: no table {hop['table']!r} with key {hop['key']!r} and those columns"
    return None


class SQLEnv(ToolEnv):
    """Question answering over the ``sql`` tool (and any extra ``tools``); see the module docstring."""

    kind = "sql"
    default_system_prompt = SYSTEM_PROMPT

    def gold_keys(self, record: QARecord) -> tuple[str, ...]:
        """Each hop's value (``meta["gold_values"]``), what a useful query's result shows."""
        values = record.meta.get("gold_values")
        return tuple(v for v in values if isinstance(v, str)) if isinstance(values, list) else ()

    def demonstrator(self, expert: ExpertConfig | None, seed: int) -> ScriptedAgent:
        return PerRecordAgent(lambda r: "chain" in r.meta, SQLExpertAgent(ExpertNoise.from_config(expert, seed)),
                              super().demonstrator(expert, seed))

    def check_demonstrable(self, records: Sequence[QARecord], path: Path) -> None:
        for line, record in enumerate(records, start=1):
            if "chain" in record.meta:
                problem = _chain_problem(record.meta["chain"])
                if problem:
                    raise DataError(path, line, "chain", f"record {record.id!r}: {problem} (agentr1.env.sql.synth)")
            elif problem := self._calls_problem(self.gold_calls(record)):
                raise DataError(path, line, "calls", f"record {record.id!r} has no generated chain (meta.chain) and "
                                f"its gold calls will not do: {problem}")

    def tokenizer_phrases(self) -> list[str]:
        return super().tokenizer_phrases() + lookup_phrases()


def build(cfg, data_dir: Path, tools: Sequence[Tool]) -> SQLEnv:
    """The ``sql`` environment over ``data_dir``'s database (the registry adds the ``sql`` tool)."""
    return SQLEnv(tools, EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward))
