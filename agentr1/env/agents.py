"""Scripted agents that play an environment (``agentr1.env.episodes`` runs them).

``OracleAgent`` proves the synthetic task is solvable through search alone: it takes only
the hop-0 entity (which is in the question) and the relation path from ``meta["chain"]``;
every later query and the answer are read from what the search returned, with
``synth.extract_relation``. ``NoisyExpertAgent`` is the same agent with scripted, seeded
mistakes; its transcripts are the warm-up demonstrations, wrong in systematic ways
(usually one hop short on 3-hop questions) so that RL has something to discover.

``GoldCallsAgent`` plays any tool environment from each record's gold calls (a record's
``meta["calls"]``, or the titles of its supporting documents for converted real QA data).

Agents are stateless: ``act`` recomputes where the episode stands from the chat messages,
so one agent object can serve any number of episodes, in any order or batch.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Callable, Collection, Protocol, Sequence

from agentr1.data.records import QARecord
from agentr1.env.qa.synth import extract_relation
from agentr1.env.protocol import (
    SEARCH_TOOL_NAME,
    TOOL_CALL_END,
    TOOL_CALL_START,
    ParsedTurn,
    format_answer,
    format_call,
    format_tool_call,
    parse_turn,
)

# Said when the relation cannot be read from the returned documents (never by the oracle on
# synthetic data; kept non-empty so the turn is still a well-formed answer).
UNKNOWN_ANSWER = "unknown"
# Realistic malformed calls (each must end at </tool_call>, where generation stops).
_MALFORMED_CALLS = (
    '{{"name": "{tool}", "arguments": {{"query": {q}}}',  # missing closing brace
    '{{"name": "lookup", "arguments": {{"query": {q}}}}}',  # unknown tool
    '{{"name": "{tool}", "arguments": {{"q": {q}}}}}',  # wrong argument name
    '{{"name": "{tool}", "arguments": {q}}}',  # arguments not an object
)


class ScriptedAgent(Protocol):
    def act(self, record: QARecord, messages: list[dict]) -> str:
        """The next assistant turn's text, given the chat so far (system, user, assistant/tool...)."""
        ...


@dataclass(frozen=True)
class _Progress:
    """Where an episode stands, read from its messages."""

    hop: int
    """Well-formed searches made so far (= index of the next hop to search)."""
    last_query: str | None
    last_observation: str | None
    """Tool message body that answered the last well-formed search."""
    retries: int
    """Malformed turns since the last well-formed search."""


def _is_search(turn: ParsedTurn, tools: Collection[str] = (SEARCH_TOOL_NAME,)) -> bool:
    """A well-formed call of one of ``tools``, one-query tools (what the search and sql tools'
    schemas accept; the scripted agents read their own turns, so the structural parse plus this
    check is enough)."""
    args = turn.arguments or {}
    return (turn.kind == "tool_call" and turn.name in tools and set(args) == {"query"}
            and isinstance(args["query"], str) and bool(args["query"].strip()))


def _progress(messages: Sequence[dict], tools: Collection[str] = (SEARCH_TOOL_NAME,)) -> _Progress:
    hop, retries, query, observation = 0, 0, None, None
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn = parse_turn(message["content"])
        if _is_search(turn, tools):
            hop, retries, query = hop + 1, 0, turn.query
            follows = messages[i + 1] if i + 1 < len(messages) else None
            observation = follows["content"] if follows and follows["role"] == "tool" else None
        elif turn.kind != "answer":
            retries += 1
    return _Progress(hop, query, observation, retries)


def read_relation(observation: str | None, entity: str | None, relation: str) -> str | None:
    """The value of ``relation`` for ``entity`` as stated in a search result body.

    Statements about ``entity`` itself come first (with top_k > 1 the look-alike entities'
    documents state the same relations with other values); failing that, the earliest
    statement of the relation in the results (what a reader of the top document would copy).
    """
    if not observation:
        return None
    return extract_relation(observation, relation, subject=entity) or extract_relation(observation, relation)


def _next_turn(record: QARecord, progress: _Progress, relation: str, stop_early: bool) -> str:
    """Search the hop's entity, or answer with the last value read when the chain is done."""
    chain = record.meta["chain"]
    if progress.hop == 0:
        return format_tool_call(chain[0]["query"])
    value = read_relation(progress.last_observation, progress.last_query, relation)
    if value is None:
        return format_answer(UNKNOWN_ANSWER)
    if progress.hop >= len(chain) or stop_early:
        return format_answer(value)
    return format_tool_call(value)


class OracleAgent:
    """Follows the relation path, reading every value from the search results."""

    def act(self, record: QARecord, messages: list[dict]) -> str:
        progress = _progress(messages)
        relation = record.meta["chain"][progress.hop - 1]["relation"] if progress.hop else ""
        return _next_turn(record, progress, relation, stop_early=False)


@dataclass(frozen=True)
class ExpertNoise:
    stop_short_3hop: float = 0.7
    """On questions of 3+ hops: probability of answering one hop short (the hop-2 value)."""
    distractor: float = 0.15
    """Per hop: probability of reading the distractor relation (e.g. producer for director)."""
    malformed: float = 0.05
    """Per search: probability of first emitting a malformed call, then retrying properly."""
    seed: int = 0

    @classmethod
    def from_config(cls, expert, seed: int) -> "ExpertNoise":
        """The mistakes of ``sft.expert`` (``agentr1.config.ExpertConfig``; None: the defaults)."""
        if expert is None:
            return cls(seed=seed)
        return cls(stop_short_3hop=expert.stop_short_3hop, distractor=expert.distractor,
                   malformed=expert.malformed, seed=seed)


@dataclass(frozen=True)
class ExpertPlan:
    """The mistakes of one episode, drawn once from a generator seeded by (seed, record id)."""

    stop_short: bool
    distractor: tuple[bool, ...]
    malformed: tuple[int | None, ...]
    """Per hop: index into _MALFORMED_CALLS, or None for a clean call."""


@dataclass
class NoisyExpertAgent:
    """The oracle with seeded, systematic mistakes (see ``ExpertNoise``)."""

    noise: ExpertNoise = field(default_factory=ExpertNoise)

    def plan(self, record: QARecord) -> ExpertPlan:
        # Seeding with a string is stable across processes (unlike hash()); every draw is
        # made whatever the probabilities, so changing one knob does not reshuffle the others.
        rng = random.Random(f"{self.noise.seed}/{record.id}")
        stop_short = rng.random() < self.noise.stop_short_3hop
        distractor, malformed = [], []
        for _ in record.meta["chain"]:
            distractor.append(rng.random() < self.noise.distractor)
            is_malformed, variant = rng.random() < self.noise.malformed, rng.randrange(len(_MALFORMED_CALLS))
            malformed.append(variant if is_malformed else None)
        return ExpertPlan(stop_short and len(record.meta["chain"]) >= 3, tuple(distractor), tuple(malformed))

    def act(self, record: QARecord, messages: list[dict]) -> str:
        chain, plan, progress = record.meta["chain"], self.plan(record), _progress(messages)
        hop = progress.hop
        relation = _hop_relation(chain[hop - 1], plan.distractor[hop - 1]) if hop else ""
        turn = _next_turn(record, progress, relation, stop_early=plan.stop_short and hop == len(chain) - 1)
        variant = plan.malformed[hop] if hop < len(chain) else None
        if variant is not None and progress.retries == 0:
            parsed = parse_turn(turn)
            if parsed.kind == "tool_call":
                return _malformed_call(variant, parsed.query)
        return turn


def _hop_relation(link: dict, distracted: bool) -> str:
    if distracted and link.get("distractor_relation"):
        return link["distractor_relation"]
    return link["relation"]


def _malformed_call(variant: int, query: str, tool: str = SEARCH_TOOL_NAME) -> str:
    body = _MALFORMED_CALLS[variant].format(tool=tool, q=json.dumps(query, ensure_ascii=False))
    return f"{TOOL_CALL_START}{body}{TOOL_CALL_END}"


class PerRecordAgent:
    """``first`` on the records ``use_first`` picks, ``other`` on the rest."""

    def __init__(self, use_first: Callable[[QARecord], bool], first: ScriptedAgent, other: ScriptedAgent):
        self.use_first, self.first, self.other = use_first, first, other

    def act(self, record: QARecord, messages: list[dict]) -> str:
        return (self.first if self.use_first(record) else self.other).act(record, messages)


@dataclass(frozen=True)
class GoldCallsAgent:
    """Makes a record's gold calls in order, then answers its first gold answer; with probability
    ``malformed`` per call it first emits a malformed version of it (then retries properly)."""

    gold_calls: Callable[[QARecord], list[dict] | None]
    malformed: float = 0.0
    seed: int = 0

    def act(self, record: QARecord, messages: list[dict]) -> str:
        calls = self.gold_calls(record) or []
        made, retries = 0, 0
        for message in messages:
            if message["role"] == "assistant":
                turn = parse_turn(message["content"])
                made, retries = (made + 1, 0) if turn.kind == "tool_call" else (made, retries + 1)
        if made >= len(calls):
            return format_answer(record.answers[0] if record.answers else UNKNOWN_ANSWER)
        call = calls[made]
        rng = random.Random(f"{self.seed}/{record.id}/{made}")
        if retries == 0 and rng.random() < self.malformed:
            body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
            return f"{TOOL_CALL_START}{body[:-1]}{TOOL_CALL_END}"  # missing closing brace
        return format_call(call["name"], call["arguments"])
