"""The ``mixed`` environment: one episode may search the documents and query the database.

The example of several tools in one episode (``agentr1.env.mixed.synth``: film and company
facts are documents, people and city facts are rows). ``MixedEnv`` is the QA environment (its
``search`` tool) with the ``sql`` tool beside it; a call earns ``process_new_support`` the first
time its output holds a gold item of either kind: a supporting document's id (search hops) or a
hop value (sql hops). The demonstrator (``sql_env.SQLExpertAgent``) plays each hop with its own tool, reading a document's relation
or a row's first cell, with the QA expert's systematic mistakes (``agents.ExpertNoise``): one
hop short on most 3-hop questions; the distractor relation of a document, or the distractor
column of a table; a malformed call first. Without mistakes it is the oracle (EM 1.0, tested).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from agentr1.data.records import DataError, QARecord
from agentr1.env.agents import ExpertNoise, PerRecordAgent
from agentr1.env.base import EnvSettings
from agentr1.env.protocol import SEARCH_TOOL_NAME
from agentr1.env.qa.env import QAEnv
from agentr1.env.rewards import RewardWeights
from agentr1.env.qa.search import index_of
from agentr1.env.sql.tool import SQL_TOOL_NAME
from agentr1.env.sql.env import SQLExpertAgent, _chain_problem, lookup_phrases, oracle  # noqa: F401 (oracle: the same)
from agentr1.env.tools import Tool

if TYPE_CHECKING:
    from agentr1.config import ExpertConfig
    from agentr1.env.agents import ScriptedAgent

TOOLS = (SEARCH_TOOL_NAME, SQL_TOOL_NAME)
SYSTEM_PROMPT = (
    "Answer the question using two tools: search finds documents about films and companies; sql queries "
    "a database of people and cities. Call one with <tool_call>{\"name\": ..., \"arguments\": {\"query\": ...}}"
    "</tool_call>, one entity at a time, and follow the facts you find. Answer as <answer>...</answer>."
)


class MixedEnv(QAEnv):
    """Search and sql in one episode (module docstring)."""

    kind = "mixed"
    default_system_prompt = SYSTEM_PROMPT

    def gold_keys(self, record: QARecord) -> tuple[str, ...]:
        """The search hops' documents and the sql hops' values: what each tool's output keys hold."""
        chain = record.meta.get("chain")
        hops = chain if isinstance(chain, list) else []
        return record.supporting_docs + tuple(h["answer"] for h in hops if isinstance(h, dict)
                                              and h.get("tool") == SQL_TOOL_NAME and isinstance(h.get("answer"), str))

    def demonstrator(self, expert: ExpertConfig | None, seed: int) -> ScriptedAgent:
        gold = super(QAEnv, self).demonstrator(expert, seed)  # ToolEnv's: the record's gold calls
        return PerRecordAgent(lambda r: "chain" in r.meta, SQLExpertAgent(ExpertNoise.from_config(expert, seed)), gold)

    def check_demonstrable(self, records: Sequence[QARecord], path: Path) -> None:
        for line, record in enumerate(records, start=1):
            chain = record.meta.get("chain")
            if chain is None:
                problem = self._calls_problem(self.gold_calls(record))
            elif not isinstance(chain, list) or not all(isinstance(h, dict) and h.get("tool") in TOOLS for h in chain):
                problem = f"every meta.chain hop needs a tool ({', '.join(TOOLS)})"
            else:
                sql_hops = [h for h in chain if h["tool"] == SQL_TOOL_NAME]
                problem = _chain_problem(sql_hops) if sql_hops else None
            if problem:
                raise DataError(path, line, "chain", f"record {record.id!r}: {problem} (agentr1.env.mixed.synth)")

    def gold_calls(self, record: QARecord) -> list[dict] | None:
        calls = record.meta.get("calls")
        return calls if isinstance(calls, list) else None

    def tokenizer_phrases(self) -> list[str]:
        return super().tokenizer_phrases() + lookup_phrases()


def build(cfg, data_dir: Path, tools: Sequence[Tool]) -> MixedEnv:
    """The ``mixed`` environment: search over ``data_dir``'s corpus, sql over its database."""
    return MixedEnv(index_of(data_dir), EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward),
                    [t for t in tools if t.name != SEARCH_TOOL_NAME])
