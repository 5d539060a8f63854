"""The multi-hop QA environment: an agent searches a corpus over several turns, then answers.

One episode = one question. Each assistant turn is parsed (``protocol.parse_turn``):

- a well-formed search call runs the search (``top_k`` documents) and returns their text
  as the observation; process reward ``process_valid_call`` plus ``process_new_support``
  when the call retrieved *at least one* supporting document not retrieved earlier in the
  episode (a flat bonus per call, not per document, so the reward per hop is the same
  whatever ``top_k`` is, and repeating a search earns nothing);
- a malformed turn gets the parser's error text as the observation, ``process_bad_call``
  now and ``format_bad_call`` in the outcome (that text quotes the turn only as a short, inert
  ``protocol.excerpt``, so whatever the policy wrote, the observation encodes and holds no chat
  special token);
- an answer ends the episode with the outcome reward (see ``rewards.outcome_reward``).

The turn that uses the last of ``max_turns`` without answering ends the episode with the
outcome of "no answer"; ``finalize`` does the same for cuts made by the rollout engine
(context full). ``step_batch`` runs all the batch's searches in one ``batch_search`` call.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Protocol, Sequence

from agentr1.config import EnvConfig
from agentr1.data.records import QARecord
from agentr1.env.protocol import SEARCH_TOOL_SCHEMA, ParsedTurn, encodable, parse_turn
from agentr1.env.rewards import (
    AnswerScores,
    RewardWeights,
    format_reward,
    outcome_reward,
    process_reward,
    score_answer,
)
from agentr1.env.search import Hit, format_hits

NO_RESULTS = "No documents found."
END_ANSWER = "answer"
END_MAX_TURNS = "max_turns"

SYSTEM_PROMPT = (
    "Answer the question by searching a document collection. To search, write "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call> and read the '
    "result. Search one entity at a time and follow the facts you find. When you know the "
    "answer, write it as <answer>...</answer>."
)


class Searcher(Protocol):
    """What the environment needs from a search tool (``search.SearchIndex`` is one)."""

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]: ...


@dataclass(frozen=True)
class EnvSettings:
    """The environment's knobs. No defaults here: they are built from the validated config's
    ``env`` section (:meth:`from_config`), the one place every default lives."""

    top_k: int
    """Documents returned per search."""
    max_turns: int
    """Assistant turns per episode (searches + answer); the last one ends the episode."""
    max_query_chars: int
    """Longer queries are malformed calls."""
    max_doc_chars: int | None
    """Each returned document's text is cut to this many characters (None: whole)."""
    doc_header: bool
    """Start each returned document with "Doc <rank> (<title>): "; off, the tool message is the
    documents' text alone, one per line (~9 tokens shorter per document)."""
    system_prompt: str | None
    """Replaces the default instructions (a tiny from-scratch model does better with a short one)."""

    @classmethod
    def from_config(cls, env: EnvConfig, **changes) -> "EnvSettings":
        """The settings of ``env`` (``agentr1.config.EnvConfig``), with ``changes`` applied."""
        return cls(**{**{f.name: getattr(env, f.name) for f in fields(cls)}, **changes})

    def __post_init__(self) -> None:
        for name in ("top_k", "max_turns", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"env.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_doc_chars is not None and self.max_doc_chars < 1:
            raise ValueError(f"env.max_doc_chars must be >= 1 or None, got {self.max_doc_chars}")


@dataclass
class EpisodeState:
    """Everything the environment tracks for one episode (mutated by ``step``)."""

    record: QARecord
    turns: int = 0
    retrieved: set[str] = field(default_factory=set)
    n_calls: int = 0
    n_bad_calls: int = 0
    answer: str | None = None
    done: bool = False
    end_reason: str | None = None
    """"answer", "max_turns" or the reason given to ``finalize``."""
    scores: AnswerScores = field(default_factory=AnswerScores)
    queries: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StepResult:
    observation: str | None
    """Tool message body (search results or "Error: ..."), without the <tool_response> wrapper; None when done."""
    done: bool
    process_reward: float
    """Reward of this turn (0 when process rewards are disabled)."""
    outcome_reward: float
    """Nonzero only when done."""
    info: dict[str, float]
    """Per-turn components (valid_call, bad_call, new_support) and, when done, the episode's
    answer components (em, f1, contains, format_ok, answered, format_reward, truncated); 0 otherwise."""


@dataclass(frozen=True)
class _TurnParts:
    valid_call: bool = False
    new_support: bool = False
    bad_call: bool = False


class QAEnv:
    """Multi-hop QA over a search tool; see the module docstring for the reward rules."""

    def __init__(self, search: Searcher, config: EnvSettings, weights: RewardWeights):
        self.search = search
        self.config = config
        self.weights = weights

    @property
    def tools(self) -> list[dict]:
        """The tool schemas to pass to ``apply_chat_template(..., tools=...)``."""
        return [SEARCH_TOOL_SCHEMA]

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT if self.config.system_prompt is None else self.config.system_prompt

    def user_prompt(self, record: QARecord) -> str:
        return f"Question: {record.question}"

    def reset(self, record: QARecord) -> EpisodeState:
        return EpisodeState(record=record)

    def step(self, state: EpisodeState, turn_text: str) -> StepResult:
        return self.step_batch([state], [turn_text])[0]

    def step_batch(self, states: Sequence[EpisodeState], turn_texts: Sequence[str]) -> list[StepResult]:
        """Advance each episode by one turn; all searches of the batch go in one ``batch_search``."""
        if len(states) != len(turn_texts):
            raise ValueError(f"step_batch: {len(states)} states but {len(turn_texts)} turn texts")
        for state in states:
            if state.done:
                raise ValueError(f"step: episode {state.record.id!r} is already done")
        parsed = [parse_turn(text, self.config.max_query_chars) for text in turn_texts]
        queries = [turn.query for turn in parsed if turn.kind == "tool_call"]
        hits = iter(self.search.batch_search(queries, self.config.top_k) if queries else [])
        return [
            self._apply(state, turn, next(hits) if turn.kind == "tool_call" else [])
            for state, turn in zip(states, parsed)
        ]

    def finalize(self, state: EpisodeState, reason: str) -> StepResult:
        """End an episode cut from outside (e.g. context full): outcome of "no answer"."""
        if state.done:
            raise ValueError(f"finalize: episode {state.record.id!r} is already done")
        return self._end(state, reason, _TurnParts(), process=0.0)

    def episode_metrics(self, state: EpisodeState) -> dict[str, float]:
        supporting = set(state.record.supporting_docs)
        found = supporting & state.retrieved
        return {
            "em": state.scores.em,
            "f1": state.scores.f1,
            "contains": state.scores.contains,
            "format_ok": float(_format_ok(state)),
            "answered": float(state.answer is not None),
            "n_calls": float(state.n_calls),
            "n_bad_calls": float(state.n_bad_calls),
            "turns": float(state.turns),
            "support_recall": len(found) / len(supporting) if supporting else 0.0,
            "retrieval_hit": float(bool(found)),
        }

    def _apply(self, state: EpisodeState, turn: ParsedTurn, hits: list[Hit]) -> StepResult:
        state.turns += 1
        if turn.kind == "answer":
            state.answer = turn.answer
            return self._end(state, END_ANSWER, _TurnParts(), process=0.0)
        if turn.kind == "tool_call":
            observation, parts = self._record_call(state, turn.query, hits)
        else:
            state.n_bad_calls += 1
            observation, parts = turn.error, _TurnParts(bad_call=True)
        process = process_reward(parts.valid_call, parts.new_support, parts.bad_call, self.weights)
        if state.turns >= self.config.max_turns:
            return self._end(state, END_MAX_TURNS, parts, process)
        return StepResult(observation, False, process, 0.0, self._info(state, parts))

    def _record_call(self, state: EpisodeState, query: str, hits: list[Hit]) -> tuple[str, _TurnParts]:
        state.n_calls += 1
        state.queries.append(query)
        ids = {hit.doc_id for hit in hits}
        new_support = bool((ids - state.retrieved) & set(state.record.supporting_docs))
        state.retrieved |= ids
        # encodable: a corpus read from JSON may hold a lone-surrogate escape too.
        body = encodable(format_hits(hits, self.config.max_doc_chars, header=self.config.doc_header)) or NO_RESULTS
        return body, _TurnParts(valid_call=True, new_support=new_support)

    def _end(self, state: EpisodeState, reason: str, parts: _TurnParts, process: float) -> StepResult:
        state.done = True
        state.end_reason = reason
        state.scores = score_answer(state.answer, state.record.answers)
        answered = state.answer is not None
        outcome = outcome_reward(state.scores, answered, state.n_bad_calls, self.weights)
        return StepResult(None, True, process, outcome, self._info(state, parts))

    def _info(self, state: EpisodeState, parts: _TurnParts) -> dict[str, float]:
        info = {
            "valid_call": float(parts.valid_call),
            "bad_call": float(parts.bad_call),
            "new_support": float(parts.new_support),
            "em": 0.0, "f1": 0.0, "contains": 0.0, "format_ok": 0.0, "answered": 0.0,
            "format_reward": 0.0, "truncated": 0.0,
        }
        if state.done:
            answered = state.answer is not None
            info.update(
                em=state.scores.em, f1=state.scores.f1, contains=state.scores.contains,
                format_ok=float(_format_ok(state)), answered=float(answered),
                format_reward=format_reward(answered, state.n_bad_calls, self.weights),
                truncated=float(not answered),
            )
        return info


def _format_ok(state: EpisodeState) -> bool:
    """A well-formed answer and no malformed turn in the whole episode."""
    return state.answer is not None and state.n_bad_calls == 0
