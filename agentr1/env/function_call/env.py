"""The ``function_call`` environment: each record brings its own functions; the agent answers the
user's request with one call, judged by BFCL's checker.

An episode: the system turn lists the record's functions (:func:`agentr1.env.protocol.hermes_tools_block`,
the layout BFCL's Qwen function-calling handler writes, after the question's own system message),
the user turn is the request, and the agent writes one ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``. A well-formed call ends the episode and is judged (:func:`bfcl.judge`); a
malformed turn gets an error observation and, while turns remain (``env.max_turns``), another
try, so the action mask separates the agent's attempts from the environment's replies; an
``<answer>`` in prose ends the episode without a call (BFCL counts it wrong).

Rewards (``reward.*``): the outcome is ``outcome_em`` times the checker's verdict plus the format
part (``format_answer`` for ending with a call, ``format_bad_call`` per malformed turn); the
process reward of the call's turn is the call decomposed (ToolRL's parts, arXiv 2504.13958):
``process_valid_call`` (well-formed), ``process_call_name`` (the gold function),
``process_call_keys`` (exactly the allowed argument names) and ``process_call_values`` (times the
share of arguments right); ``process_bad_call`` for a malformed turn.

Episode metrics: ``em`` (the checker's verdict), ``f1`` (partial credit: the mean of the three
parts), ``answered`` (a call was made), ``format_ok`` and the parts themselves
(:attr:`FunctionCallEnv.extra_metrics`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from agentr1.data.records import DataError, QARecord
from agentr1.env.base import END_ANSWER, END_MAX_TURNS, EnvSettings, Environment, StepResult
from agentr1.env.function_call.bfcl import Verdict, judge, prompt_functions
from agentr1.env.protocol import ParsedTurn, hermes_tools_block, parse_turn
from agentr1.env.rewards import RewardWeights, format_reward

if TYPE_CHECKING:
    from agentr1.config import ExpertConfig
    from agentr1.env.agents import ScriptedAgent
    from agentr1.env.tools import Tool

END_CALL = "call"
NO_CALL = Verdict(False, "no_call", False, False, 0.0)


@dataclass
class CallState:
    """One episode: the record, its turns, the call made (if any) and its verdict."""

    record: QARecord
    turns: int = 0
    n_bad_calls: int = 0
    call: dict | None = None
    """``{"name", "arguments"}`` of the well-formed call that ended the episode."""
    answer: str | None = None
    """Prose answered in an ``<answer>`` instead of a call."""
    verdict: Verdict = field(default_factory=lambda: NO_CALL)
    done: bool = False
    end_reason: str | None = None


class FunctionCallEnv(Environment):
    """See the module docstring."""

    kind = "function_call"
    default_system_prompt = ""
    extra_metrics = ("call_name", "call_keys", "call_values")
    tools_per_record = True

    def __init__(self, settings: EnvSettings, weights: RewardWeights):
        self.settings = settings
        self.weights = weights

    @property
    def tools(self) -> list[dict]:
        return []  # each record brings its own functions, in its system turn

    def system_prompt(self) -> str:
        return self.settings.system_prompt or self.default_system_prompt

    def system_turn(self, record: QARecord | None = None) -> str | None:
        """The user's instructions (``env.system_prompt``), the question's own system message, and
        the record's functions in the Hermes tool block."""
        parts = [self.system_prompt(), record.meta.get("system", "") if record else ""]
        if record is not None:
            parts.append(hermes_tools_block(prompt_functions(record.meta.get("functions", []))))
        return "\n\n".join(p for p in parts if p) or None

    def user_prompt(self, record: QARecord) -> str:
        return record.question

    def group(self, record: QARecord) -> str | None:
        """BFCL's category (``simple_python``, ``live_simple``...): the leaderboard reports each."""
        return record.meta.get("category")

    def parse(self, text: str) -> ParsedTurn:
        """The turn's structure only: BFCL's function documents use its own type names ("dict",
        "float", "tuple", "any"), which the checker, not a JSON-schema check, judges."""
        return parse_turn(text, None, self.settings.max_query_chars)

    def reset(self, record: QARecord) -> CallState:
        return CallState(record)

    def step_batch(self, states: Sequence[CallState], turn_texts: Sequence[str]) -> list[StepResult]:
        if len(states) != len(turn_texts):
            raise ValueError(f"step_batch: {len(states)} states but {len(turn_texts)} turn texts")
        return [self._step(s, t) for s, t in zip(states, turn_texts)]

    def _step(self, state: CallState, text: str) -> StepResult:
        if state.done:
            raise ValueError(f"step: episode {state.record.id!r} is already done")
        state.turns += 1
        turn = self.parse(text)
        w = self.weights
        if turn.kind == "tool_call":
            meta = state.record.meta
            state.call = {"name": turn.name, "arguments": turn.arguments}
            if "ground_truth" in meta:  # a served question has none: its call is the result, unjudged
                state.verdict = judge(meta["functions"], meta["ground_truth"], meta.get("category", "simple_python"),
                                      turn.name, turn.arguments)
            v = state.verdict
            process = (w.process_valid_call + w.process_call_name * v.name + w.process_call_keys * v.keys
                       + w.process_call_values * v.values) if w.process_enabled else 0.0
            return self._end(state, END_CALL, process)
        if turn.kind == "answer":
            state.answer = turn.answer
            return self._end(state, END_ANSWER, 0.0)
        state.n_bad_calls += 1
        process = w.process_bad_call if w.process_enabled else 0.0
        if state.turns >= self.settings.max_turns:
            return self._end(state, END_MAX_TURNS, process, bad_call=True)
        return StepResult(turn.error, False, process, 0.0, self._info(state, bad_call=True))

    def finalize(self, state: CallState, reason: str) -> StepResult:
        if state.done:
            raise ValueError(f"finalize: episode {state.record.id!r} is already done")
        return self._end(state, reason, 0.0)

    def _end(self, state: CallState, reason: str, process: float, bad_call: bool = False) -> StepResult:
        state.done, state.end_reason = True, reason
        called = state.call is not None
        outcome = self.weights.outcome_em * state.verdict.valid + self.weights.outcome_f1 * state.verdict.partial \
            + format_reward(called, state.n_bad_calls, self.weights)
        return StepResult(None, True, process, outcome, self._info(state, bad_call=bad_call))

    def _info(self, state: CallState, bad_call: bool = False) -> dict[str, float]:
        m = self.episode_metrics(state) if state.done else {}
        return {"valid_call": float(state.done and state.call is not None), "bad_call": float(bad_call),
                "tool_error": 0.0, "new_support": 0.0, "em": m.get("em", 0.0), "f1": m.get("f1", 0.0),
                "contains": 0.0, "format_ok": m.get("format_ok", 0.0), "answered": m.get("answered", 0.0),
                "format_reward": format_reward(state.call is not None, state.n_bad_calls, self.weights)
                if state.done else 0.0, "truncated": float(state.done and state.call is None)}

    def episode_metrics(self, state: CallState) -> dict[str, float]:
        v, called = state.verdict, state.call is not None
        return {"em": float(v.valid), "f1": v.partial, "contains": float(v.name), "format_ok": float(
                called and state.n_bad_calls == 0), "answered": float(called), "n_calls": float(called),
                "n_bad_calls": float(state.n_bad_calls), "n_tool_errors": 0.0, "turns": float(state.turns),
                "support_recall": 0.0, "retrieval_hit": 0.0, "call_name": float(v.name), "call_keys": float(v.keys),
                "call_values": v.values}

    # Demonstrations: the record's canonical gold call (bfcl.canonical_call).

    def demonstrator(self, expert: ExpertConfig | None, seed: int) -> ScriptedAgent:
        from agentr1.env.agents import GoldCallsAgent

        return GoldCallsAgent(lambda r: r.meta.get("calls"), malformed=expert.malformed if expert else 0.0,
                              seed=seed)

    def check_demonstrable(self, records: Sequence[QARecord], path: Path) -> None:
        for line, record in enumerate(records, start=1):
            meta = record.meta
            calls = meta.get("calls")
            if not (isinstance(calls, list) and len(calls) == 1 and isinstance(calls[0], dict)
                    and isinstance(calls[0].get("arguments"), dict)):
                raise DataError(path, line, "calls", f"record {record.id!r}: expected one gold call "
                                '[{"name": ..., "arguments": {...}}], what the warm-up demonstrates')
            for key in ("functions", "ground_truth", "category"):
                if key not in meta:
                    raise DataError(path, line, key, f"record {record.id!r}: missing (bfcl-format records carry "
                                    "functions, ground_truth and category; agentr1 data convert --format bfcl)")


def build(cfg, data_dir: Path, tools: Sequence[Tool]) -> FunctionCallEnv:
    """The ``function_call`` environment (its functions come with each record; ``env.tools`` and
    MCP tools have no place in it)."""
    if tools:
        raise ValueError("env.kind 'function_call': each record brings its own functions; env.tools and env.mcp "
                         f"must be empty (got {', '.join(t.name for t in tools)})")
    return FunctionCallEnv(EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward))
