"""The multi-hop QA environment: an agent searches a corpus over several turns, then answers.

One episode = one question. ``QAEnv`` is the tool-use environment (``agentr1.env.base.ToolEnv``:
parsing, rewards, episode metrics) with the ``search`` tool (``search.SearchTool``: top-``k`` BM25
documents) and possibly more tools (``env.tools``). A search earns ``process_new_support`` when
it retrieved *at least one* supporting document not retrieved earlier in the episode (a flat
bonus per call, not per document, so the reward per hop is the same whatever ``top_k`` is, and
repeating a search earns nothing).

Demonstrations for the warm-up (``demonstrator``): on synthetic questions (``meta["chain"]``)
the noisy expert of ``agents.NoisyExpertAgent`` (systematic mistakes RL can fix); on converted
real data (HotpotQA, MuSiQue) the gold trajectory: search each supporting document's title in
order, then answer.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from agentr1.data.records import DataError, QARecord
from agentr1.env.base import END_ANSWER, END_MAX_TURNS, EnvSettings, EpisodeState, StepResult, ToolEnv
from agentr1.env.protocol import SEARCH_TOOL_NAME
from agentr1.env.rewards import RewardWeights
from agentr1.env.qa.search import NO_RESULTS, SearchIndex, SearchTool, index_of
from agentr1.env.tools import Tool

if TYPE_CHECKING:
    from agentr1.config import ExpertConfig
    from agentr1.env.agents import ScriptedAgent

# The interface's types, under the names callers used when this module held them.
__all__ = ["END_ANSWER", "END_MAX_TURNS", "EnvSettings", "EpisodeState", "QAEnv", "StepResult", "build"]

SYSTEM_PROMPT = (
    "Answer the question by searching a document collection. To search, write "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call> and read the '
    "result. Search one entity at a time and follow the facts you find. When you know the "
    "answer, write it as <answer>...</answer>."
)


class QAEnv(ToolEnv):
    """Multi-hop QA over the search tool (and any extra ``tools``); see the module docstring."""

    kind = "qa"
    default_system_prompt = SYSTEM_PROMPT
    empty_output = NO_RESULTS

    def __init__(self, search: SearchIndex, settings: EnvSettings, weights: RewardWeights,
                 tools: Sequence[Tool] = ()):
        self.search = search
        self._titles = {d.id: d.title for d in search.docs}
        searcher = Tool.from_callable(SearchTool(search, settings.top_k, settings.max_doc_chars, settings.doc_header))
        super().__init__([searcher, *tools], settings, weights)

    def gold_calls(self, record: QARecord) -> list[dict] | None:
        """Search each supporting document's title, in order (converted real data)."""
        if not record.supporting_docs or any(d not in self._titles for d in record.supporting_docs):
            return None
        return [{"name": SEARCH_TOOL_NAME, "arguments": {"query": self._titles[d][: self.settings.max_query_chars]}}
                for d in record.supporting_docs]

    def demonstrator(self, expert: ExpertConfig | None, seed: int) -> ScriptedAgent:
        """The noisy expert on synthetic questions, the gold trajectory on the others."""
        from agentr1.env.agents import ExpertNoise, NoisyExpertAgent, PerRecordAgent

        return PerRecordAgent(lambda r: "chain" in r.meta, NoisyExpertAgent(ExpertNoise.from_config(expert, seed)),
                              super().demonstrator(expert, seed))

    def check_demonstrable(self, records: Sequence[QARecord], path: Path) -> None:
        for line, record in enumerate(records, start=1):
            if "chain" not in record.meta and self.gold_calls(record) is None:
                raise DataError(path, line, "supporting_docs",
                                f"record {record.id!r} has neither a relation chain (meta.chain, synthetic data) "
                                "nor supporting documents in the corpus, so the warm-up cannot demonstrate it")


def build(cfg, data_dir: Path, tools: Sequence[Tool]) -> QAEnv:
    """The ``qa`` environment over ``data_dir``'s corpus (or a corpus file, for a served agent),
    with ``tools`` beside its own search tool (``env.tools: [search]`` names that one)."""
    return QAEnv(index_of(data_dir), EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward),
                 [t for t in tools if t.name != SEARCH_TOOL_NAME])
