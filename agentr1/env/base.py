"""The environment interface, and the tool-use environment every built-in one is.

What the rollout engine, the warm-up, evaluation, the ablation runs, the served agent and the
pipeline need from an environment (:class:`Environment`):

- ``tools``: the tool schemas for the chat template; ``system_turn(record)`` and
  ``user_prompt(record)``: the first prompt of an episode (the system turn may depend on the record:
  a function-calling question brings its own functions);
- ``reset(record)`` -> state, ``step_batch(states, turn_texts)`` -> one :class:`StepResult` per
  episode (observation, process reward, outcome, done), ``finalize(state, reason)`` for an episode
  cut from outside (context full), ``episode_metrics(state)``;
- ``demonstrator(expert, seed)``: a scripted agent whose transcripts the warm-up imitates, and
  ``check_demonstrable(records, path)``: a :class:`DataError` naming the first record it cannot
  play, raised before a run writes anything;
- ``tokenizer_phrases()``: fixed call text a from-scratch tokenizer should make whole tokens.

:class:`ToolEnv` is the multi-turn tool-use environment: each assistant turn is parsed
(``protocol.parse_turn``, arguments checked against the tools' schemas); a well-formed call runs
its tool (all of a turn's calls to one tool in one ``Tool.run_batch``) and earns
``process_valid_call``, plus ``process_new_support`` when its output's keys hold a gold item of
the record (``gold_keys``: by default ``supporting_docs``) not found earlier in the episode (a flat bonus per call);
a malformed turn, or a call whose tool raised, gets an error observation, ``process_bad_call``
now and ``format_bad_call`` in the outcome; an answer ends the episode with the outcome reward
(``rewards.outcome_reward``). The turn that uses the last of ``max_turns`` ends the episode with
the outcome of "no answer". Environments are registered by kind in ``agentr1.env.registry``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from agentr1.data.records import DataError, QARecord
from agentr1.env.protocol import ParsedTurn, parse_turn
from agentr1.env.rewards import AnswerScores, RewardWeights, format_reward, outcome_reward, process_reward, score_answer
from agentr1.env.sandbox import SandboxLimits, sandboxed
from agentr1.env.tools import Tool, ToolOutput, check_unique

if TYPE_CHECKING:
    from agentr1.config import EnvConfig, ExpertConfig
    from agentr1.env.agents import ScriptedAgent

END_ANSWER = "answer"
END_MAX_TURNS = "max_turns"
EMPTY_OUTPUT = "(no output)"


@dataclass(frozen=True)
class EnvSettings:
    """The environment's knobs. No defaults here: they are built from the validated config's
    ``env`` section (:meth:`from_config`), the one place every default lives."""

    top_k: int
    """Documents returned per search."""
    max_turns: int
    """Assistant turns per episode (tool calls + answer); the last one ends the episode."""
    max_query_chars: int
    """A call with a longer string argument is malformed."""
    max_doc_chars: int | None
    """Each returned document's text is cut to this many characters (None: whole)."""
    doc_header: bool
    """Start each returned document with "Doc <rank> (<title>): "; off, the tool message is the
    documents' text alone, one per line (~9 tokens shorter per document)."""
    system_prompt: str | None
    """Replaces the environment's default instructions ("": no system turn)."""
    sandbox: SandboxLimits | None = None
    """The bounds every tool call runs within (``agentr1.env.sandbox``); None: in this process."""

    @classmethod
    def from_config(cls, env: EnvConfig, **changes) -> "EnvSettings":
        """The settings of ``env`` (``agentr1.config.EnvConfig``), with ``changes`` applied."""
        limits = SandboxLimits.from_config(env.sandbox) if env.sandbox.enabled else None
        plain = {f.name: getattr(env, f.name) for f in fields(cls) if f.name != "sandbox"}
        return cls(**{**plain, "sandbox": limits, **changes})

    def __post_init__(self) -> None:
        for name in ("top_k", "max_turns", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"env.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_doc_chars is not None and self.max_doc_chars < 1:
            raise ValueError(f"env.max_doc_chars must be >= 1 or None, got {self.max_doc_chars}")


@dataclass
class EpisodeState:
    """Everything the environment tracks for one episode (mutated by ``step_batch``)."""

    record: QARecord
    turns: int = 0
    retrieved: set[str] = field(default_factory=set)
    """Keys of every tool output so far (for search: document ids)."""
    n_calls: int = 0
    n_bad_calls: int = 0
    """Malformed turns and calls whose tool failed."""
    n_tool_errors: int = 0
    """Well-formed calls whose tool raised."""
    answer: str | None = None
    done: bool = False
    end_reason: str | None = None
    """"answer", "max_turns" or the reason given to ``finalize``."""
    scores: AnswerScores = field(default_factory=AnswerScores)
    calls: list[dict] = field(default_factory=list)
    """The well-formed calls, ``{"name", "arguments"}``, in order."""

    @property
    def queries(self) -> list[str]:
        return [c["arguments"].get("query") for c in self.calls if "query" in c["arguments"]]


@dataclass(frozen=True)
class StepResult:
    observation: str | None
    """Tool message body (tool output or "Error: ..."), without the <tool_response> wrapper; None when done."""
    done: bool
    process_reward: float
    """Reward of this turn (0 when process rewards are disabled)."""
    outcome_reward: float
    """Nonzero only when done."""
    info: dict[str, float]
    """Per-turn components (valid_call, bad_call, tool_error, new_support) and, when done, the episode's
    answer components (em, f1, contains, format_ok, answered, format_reward, truncated); 0 otherwise."""


@dataclass(frozen=True)
class _TurnParts:
    valid_call: bool = False
    new_support: bool = False
    bad_call: bool = False
    tool_error: bool = False


class Environment(ABC):
    """What every part of the project needs from an environment (module docstring)."""

    kind: str = ""
    """The registered name (``env.kind`` in the config)."""

    @property
    @abstractmethod
    def tools(self) -> list[dict]:
        """The tool schemas to pass to ``apply_chat_template(..., tools=...)``."""

    @abstractmethod
    def system_prompt(self) -> str: ...

    def system_turn(self, record: QARecord | None = None) -> str | None:
        """The system message of ``record``'s episode as the chat format takes it: None when the
        system prompt is empty (``env.system_prompt: ""``), which means no system turn at all.
        Here the same for every record; an environment whose records bring their own tools
        (``function_call``) renders them here."""
        return self.system_prompt() or None

    tools_per_record: bool = False
    """Each record brings the tools the agent may call (``function_call``: a question's
    functions, in its system turn); a served agent then needs them with every question."""

    def group(self, record: QARecord) -> str | None:
        """The group an evaluation also reports ``record`` in (``{mode}/<group>/<metric>``, beside
        the hop counts), e.g. a benchmark's category; None: none."""
        return None

    extra_metrics: tuple[str, ...] = ()
    """Episode metrics of this environment beyond ``agentr1.evaluate.METRIC_KEYS`` that
    evaluations and PPO's rollout metrics also average (e.g. ``called``, the tool-call rate)."""

    @abstractmethod
    def user_prompt(self, record: QARecord) -> str: ...

    @abstractmethod
    def reset(self, record: QARecord) -> Any: ...

    @abstractmethod
    def step_batch(self, states: Sequence[Any], turn_texts: Sequence[str]) -> list[StepResult]: ...

    @abstractmethod
    def finalize(self, state: Any, reason: str) -> StepResult: ...

    @abstractmethod
    def episode_metrics(self, state: Any) -> dict[str, float]: ...

    def parse(self, text: str) -> ParsedTurn:
        """An assistant turn as this environment reads it."""
        return parse_turn(text)

    def step(self, state: Any, turn_text: str) -> StepResult:
        return self.step_batch([state], [turn_text])[0]

    def demonstrator(self, expert: ExpertConfig | None, seed: int) -> ScriptedAgent:
        """The scripted agent whose transcripts seed the warm-up (``expert``: its mistakes; None:
        none)."""
        raise NoDemonstrations(f"the {self.kind!r} environment has no scripted demonstrator: train from an "
                               "existing warm-up (<output_dir>/warmup) or a pretrained model with sft.steps=0 "
                               "and sft.value_fit_episodes=0")

    def check_demonstrable(self, records: Sequence[QARecord], path: Path) -> None:
        """A DataError naming the first record of ``path`` the demonstrator cannot play (here:
        :class:`NoDemonstrations`, there is no demonstrator at all)."""
        self.demonstrator(None, 0)

    def tokenizer_phrases(self) -> list[str]:
        return []


class NoDemonstrations(ValueError):
    """The environment cannot script demonstrations for the warm-up; the message says what to do."""


class ToolEnv(Environment):
    """Multi-turn tool use over ``tools`` (module docstring); answers are scored against the
    record's ``answers``, and tool outputs' keys against its ``supporting_docs``."""

    kind = "tools"
    default_system_prompt = ("Answer the question, using the tools when you need them. To call a tool, write "
                             '<tool_call>{"name": ..., "arguments": {...}}</tool_call> and read the result. '
                             "When you know the answer, write it as <answer>...</answer>.")

    def __init__(self, tools: Sequence[Tool], settings: EnvSettings, weights: RewardWeights):
        if not tools:
            raise ValueError("an environment needs at least one tool")
        check_unique(tools)
        self._tools = {t.name: t for t in sandboxed(list(tools), settings.sandbox)}
        self._parameters = {t.name: t.parameters for t in tools}
        self.settings = settings
        self.weights = weights

    @property
    def tools(self) -> list[dict]:
        return [t.prompt_schema() for t in self._tools.values()]

    def tool(self, name: str) -> Tool:
        return self._tools[name]

    def system_prompt(self) -> str:
        return self.default_system_prompt if self.settings.system_prompt is None else self.settings.system_prompt

    def user_prompt(self, record: QARecord) -> str:
        return f"Question: {record.question}"

    def parse(self, text: str) -> ParsedTurn:
        return parse_turn(text, self._parameters, self.settings.max_query_chars)

    def reset(self, record: QARecord) -> EpisodeState:
        return EpisodeState(record=record)

    def tokenizer_phrases(self) -> list[str]:
        phrases: list[str] = []
        for tool in self._tools.values():
            phrases += [p for p in tool.scaffold() if p and p not in phrases]
        return phrases

    def step_batch(self, states: Sequence[EpisodeState], turn_texts: Sequence[str]) -> list[StepResult]:
        """Advance each episode by one turn; each tool answers all of its calls in one batch."""
        if len(states) != len(turn_texts):
            raise ValueError(f"step_batch: {len(states)} states but {len(turn_texts)} turn texts")
        for state in states:
            if state.done:
                raise ValueError(f"step: episode {state.record.id!r} is already done")
        parsed = [self.parse(text) for text in turn_texts]
        outputs: dict[int, tuple[ToolOutput, bool]] = {}
        for name, tool in self._tools.items():
            idx = [i for i, t in enumerate(parsed) if t.kind == "tool_call" and t.name == name]
            outputs.update(zip(idx, tool.run_batch([parsed[i].arguments for i in idx])))
        return [self._apply(state, turn, outputs.get(i)) for i, (state, turn) in enumerate(zip(states, parsed))]

    def finalize(self, state: EpisodeState, reason: str) -> StepResult:
        """End an episode cut from outside (e.g. context full): outcome of "no answer"."""
        if state.done:
            raise ValueError(f"finalize: episode {state.record.id!r} is already done")
        return self._end(state, reason, _TurnParts(), process=0.0)

    def gold_keys(self, record: QARecord) -> tuple[str, ...]:
        """What a tool output's keys are matched against for ``process_new_support``: the
        record's ``supporting_docs`` (document ids) here; the ``sql`` environment, its gold-chain
        values."""
        return record.supporting_docs

    def episode_metrics(self, state: EpisodeState) -> dict[str, float]:
        supporting = set(self.gold_keys(state.record))
        found = supporting & state.retrieved
        return {
            "em": state.scores.em,
            "f1": state.scores.f1,
            "contains": state.scores.contains,
            "format_ok": float(_format_ok(state)),
            "answered": float(state.answer is not None),
            "n_calls": float(state.n_calls),
            "n_bad_calls": float(state.n_bad_calls),
            "n_tool_errors": float(state.n_tool_errors),
            "turns": float(state.turns),
            "support_recall": len(found) / len(supporting) if supporting else 0.0,
            "retrieval_hit": float(bool(found)),
        }

    def _apply(self, state: EpisodeState, turn: ParsedTurn, output: tuple[ToolOutput, bool] | None) -> StepResult:
        state.turns += 1
        if turn.kind == "answer":
            state.answer = turn.answer
            return self._end(state, END_ANSWER, _TurnParts(), process=0.0)
        if turn.kind == "tool_call":
            observation, parts = self._record_call(state, turn, *output)
        else:
            state.n_bad_calls += 1
            observation, parts = turn.error, _TurnParts(bad_call=True)
        process = process_reward(parts.valid_call, parts.new_support, parts.bad_call, self.weights)
        if state.turns >= self.settings.max_turns:
            return self._end(state, END_MAX_TURNS, parts, process)
        return StepResult(observation, False, process, 0.0, self._info(state, parts))

    def _record_call(self, state: EpisodeState, turn: ParsedTurn, output: ToolOutput, failed: bool
                     ) -> tuple[str, _TurnParts]:
        if failed:  # the model's call made the tool raise: a bad call, counted apart
            state.n_bad_calls += 1
            state.n_tool_errors += 1
            return output.text, _TurnParts(bad_call=True, tool_error=True)
        state.n_calls += 1
        state.calls.append({"name": turn.name, "arguments": turn.arguments})
        keys = set(output.keys)
        new_support = bool((keys - state.retrieved) & set(self.gold_keys(state.record)))
        state.retrieved |= keys
        return output.text or self.empty_output, _TurnParts(valid_call=True, new_support=new_support)

    empty_output = EMPTY_OUTPUT

    def score(self, answer: str | None, record: QARecord) -> AnswerScores:
        """How well ``answer`` (None: no answer) answers ``record``: text match against its
        ``answers`` (SQuAD-style EM and F1) here; a numeric environment compares numbers."""
        return score_answer(answer, record.answers)

    def _end(self, state: EpisodeState, reason: str, parts: _TurnParts, process: float) -> StepResult:
        state.done = True
        state.end_reason = reason
        state.scores = self.score(state.answer, state.record)
        answered = state.answer is not None
        outcome = outcome_reward(state.scores, answered, state.n_bad_calls, self.weights)
        return StepResult(None, True, process, outcome, self._info(state, parts))

    def _info(self, state: EpisodeState, parts: _TurnParts) -> dict[str, float]:
        info = {
            "valid_call": float(parts.valid_call),
            "bad_call": float(parts.bad_call),
            "tool_error": float(parts.tool_error),
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

    # Demonstrations: each record's gold calls (``meta["calls"]``), then its first answer.

    def gold_calls(self, record: QARecord) -> list[dict] | None:
        """The calls a correct episode makes, ``[{"name", "arguments"}]``, or None when unknown."""
        calls = record.meta.get("calls")
        return calls if isinstance(calls, list) else None

    def demonstrator(self, expert: ExpertConfig | None, seed: int) -> ScriptedAgent:
        from agentr1.env.agents import GoldCallsAgent

        return GoldCallsAgent(self.gold_calls, malformed=expert.malformed if expert else 0.0, seed=seed)

    def check_demonstrable(self, records: Sequence[QARecord], path: Path) -> None:
        for line, record in enumerate(records, start=1):
            calls = self.gold_calls(record)
            problem = self._calls_problem(calls)
            if problem:
                raise DataError(path, line, "meta.calls",
                                f"record {record.id!r}: {problem}; the warm-up's demonstrator plays each record's "
                                'gold calls ("calls": [{"name": <tool>, "arguments": {...}}, ...]) then answers')

    def _calls_problem(self, calls: Any) -> str | None:
        if calls is None:
            return "no gold calls"
        for k, call in enumerate(calls):
            if not isinstance(call, dict) or call.get("name") not in self._tools \
                    or not isinstance(call.get("arguments"), dict):
                return (f"call {k} must be an object naming one of the tools ({', '.join(self._tools)}) "
                        "with an arguments object")
            from agentr1.env.protocol import argument_problem

            problem = argument_problem(call["arguments"], self._parameters[call["name"]],
                                       self.settings.max_query_chars)
            if problem:
                return f"call {k}: {problem}"
        return None


def _format_ok(state: EpisodeState) -> bool:
    """A well-formed answer and no malformed turn in the whole episode."""
    return state.answer is not None and state.n_bad_calls == 0


def build_tool_env(cfg, data_dir: Path, tools: Sequence[Tool]) -> ToolEnv:
    """The ``tools`` environment: the config's ``env.tools``, nothing else."""
    if not tools:
        raise ValueError("env.kind 'tools' needs at least one tool in env.tools")
    return ToolEnv(tools, EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward))
