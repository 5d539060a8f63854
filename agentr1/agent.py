"""The trained agent answering questions: a policy, its environment and tools (for the search
agent: its corpus), and the rollout engine, built from a run's own config with the same functions
training uses (``env.registry.build_env`` / ``recipe.workspace.make_engine``), so an answer here is an
episode of evaluation.

``Agent.answer`` plays full multi-turn episodes, batched, and returns per question a plain,
JSON-ready dict (the MLflow model in ``adapters/agent_model.py`` and ``agentr1 ask`` both return it)::

    {"question": str, "answer": str | None,
     "tool_calls": [{"name": str, "arguments": dict, "result": str | None}],
     "turns": int, "finish": "answer" | "max_turns" | "context" | "call",
     "transcript": [{"role": "assistant" | "tool", "text": str}]}

A tool call's ``result`` is None when the episode ended on that turn (the policy never saw it).
A function-calling agent (``env.kind: function_call``) is asked a question with the functions it
may call (``functions``): its episode ends with the call, which is the result (``finish``
"call", the call in ``tool_calls``, no answer); the caller runs it.

The same episode in MLflow's agent shapes, for a conversation whose last user message is the
question: :func:`responses_output` (MLflow's ``ResponsesAgent``: ``function_call`` and
``function_call_output`` items, then the answer as a ``message``) and :func:`chat_agent_output`
(``ChatAgent``: assistant messages with ``tool_calls``, ``tool`` messages, the answer).
"""
from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentr1.config import Config
from agentr1.data.records import MAX_FIELD_CHARS, QARecord, unencodable

if TYPE_CHECKING:
    from agentr1.env.base import Environment
    from agentr1.episode import Trajectory

BATCH = 16
"""Questions per rollout call: the scoring server's largest request in the issue's load test."""
MAX_QUESTION_CHARS = MAX_FIELD_CHARS["question"]
"""The dataset loader's own limit for a question (``agentr1.data.records``): no training
question was longer, and a longer one would mostly fill the context before the first turn."""
SOURCE = "ask"  # the QARecord source of a question asked here
FUNCTIONS = "functions"  # what a function-calling agent's questions bring: their function documents


MAX_FUNCTIONS_CHARS = 100_000
"""A question's function documents beyond this (as JSON) are refused: they would fill the context."""


def question_record(question: str, rid: str = "0", functions: list[dict] | None = None,
                    system: str | None = None) -> QARecord:
    """A question asked here as the record an episode plays (no gold answer: nothing is scored);
    with ``functions`` (and the request's own ``system`` message) for an agent whose questions
    bring their own functions (``function_call``)."""
    meta = {"functions": functions} if functions is not None else {}
    if system:
        meta["system"] = system
    return QARecord(id=rid, question=question, answers=(), supporting_docs=(), hops=1, source=SOURCE, meta=meta)


def check_functions(functions: object, where: str = "functions") -> list[dict]:
    """The function documents a question brings: a list (or its JSON text) of BFCL-style
    ``{"name", "description", "parameters"}`` objects or OpenAI tools (``{"type": "function",
    "function": {...}}``, unwrapped); ValueError naming the field otherwise."""
    if isinstance(functions, str):
        if len(functions) > MAX_FUNCTIONS_CHARS:
            raise ValueError(f"field {where!r} has {len(functions)} characters; at most {MAX_FUNCTIONS_CHARS}")
        try:
            functions = json.loads(functions)
        except (ValueError, RecursionError):
            raise ValueError(f"field {where!r} is not JSON (a list of function documents)") from None
    if not isinstance(functions, list) or not functions:
        raise ValueError(f"field {where!r} must be a non-empty list of function documents")
    out = []
    for i, f in enumerate(functions):
        if isinstance(f, Mapping) and f.get("type") == "function" and isinstance(f.get("function"), Mapping):
            f = f["function"]
        if not (isinstance(f, Mapping) and isinstance(f.get("name"), str) and f["name"].strip()
                and isinstance(f.get("parameters", {}), Mapping)):
            raise ValueError(f"field {where!r}[{i}] must be a function document with a name and parameters")
        out.append({"name": f["name"], "description": str(f.get("description", "")),
                    "parameters": dict(f.get("parameters", {}))})
    if len(json.dumps(out, ensure_ascii=False, default=str)) > MAX_FUNCTIONS_CHARS:
        raise ValueError(f"field {where!r}: the function documents are longer than {MAX_FUNCTIONS_CHARS} characters")
    if unencodable(out) is not None:
        raise ValueError(f"field {where!r} is not valid Unicode text (a lone surrogate)")
    return out


def check_questions(questions: Sequence[object]) -> list[str]:
    """The questions as strings; ValueError naming the first bad row (0-based) otherwise:
    not a string, empty or blank, or over :data:`MAX_QUESTION_CHARS` characters."""
    if len(questions) == 0:
        raise ValueError("no questions given")
    out = []
    for row, q in enumerate(questions):
        if not isinstance(q, str):
            raise ValueError(f"row {row}: field 'question' must be a string, got {type(q).__name__} ({q!r:.40})")
        if not q.strip():
            raise ValueError(f"row {row}: field 'question' is empty")
        if unencodable(q) is not None:  # a lone surrogate: a JSON \ud800 escape, a non-UTF-8 byte in argv
            raise ValueError(f"row {row}: field 'question' is not valid Unicode text (a lone surrogate)")
        if len(q) > MAX_QUESTION_CHARS:
            raise ValueError(f"row {row}: field 'question' has {len(q)} characters; at most "
                             f"{MAX_QUESTION_CHARS} are accepted")
        out.append(q)
    return out


def check_request(questions: Sequence[object], temperature: float) -> list[str]:
    """:func:`check_questions`, and a temperature that is a number >= 0 (0: greedy)."""
    if not 0 <= temperature < math.inf:  # also refuses NaN
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    return check_questions(questions)


def transcript(question: str, traj: Trajectory, env: Environment) -> dict:
    """The JSON-ready result of one episode (module docstring). Turns are parsed again with the
    environment's own parser, so answer and calls are what the environment saw."""
    calls, answer, shown = [], None, []
    for k, text in enumerate(traj.turn_texts):
        observation = traj.observations[k] if k < len(traj.observations) else None
        shown.append({"role": "assistant", "text": text})
        if observation is not None:
            shown.append({"role": "tool", "text": observation})
        turn = env.parse(text)
        if turn.kind == "tool_call":
            calls.append({"name": turn.name, "arguments": turn.arguments, "result": observation})
        elif turn.kind == "answer":
            answer = turn.answer
    return {"question": question, "answer": answer, "tool_calls": calls, "turns": len(traj.turn_texts),
            "finish": traj.finish, "transcript": shown}


def question_of(messages: object, field: str) -> str:
    """The question of an agent request: the content of the last ``user`` message of
    ``messages`` (MLflow's ``input`` or ``messages`` field); ValueError naming the field."""
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        raise ValueError(f"field {field!r} must be a list of messages")
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise ValueError(f"field {field!r} has no user message (the question)")
    content = users[-1].get("content")
    if not isinstance(content, str):
        raise ValueError(f"field {field!r}: the last user message's content must be a string")
    return check_questions([content])[0]


def _calls(result: dict) -> list[tuple[str, dict]]:
    return [(f"call_{uuid.uuid4().hex[:24]}", call) for call in result["tool_calls"]]


def responses_output(result: dict) -> dict:
    """An episode (:func:`transcript`) as MLflow's ``ResponsesAgentResponse``: each tool call as
    a ``function_call`` item with its ``function_call_output``, then the answer as a message
    (empty text when the episode ended without one; ``custom_outputs`` says how it ended)."""
    items: list[dict] = []
    for call_id, call in _calls(result):
        items.append({"type": "function_call", "id": f"fc_{call_id[5:]}", "call_id": call_id, "name": call["name"],
                      "arguments": json.dumps(call["arguments"], ensure_ascii=False)})
        if call["result"] is not None:
            items.append({"type": "function_call_output", "call_id": call_id, "output": call["result"]})
    items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant",
                  "content": [{"type": "output_text", "text": result["answer"] or "", "annotations": []}]})
    return {"output": items, "custom_outputs": {"finish": result["finish"], "turns": result["turns"]}}


def chat_agent_output(result: dict) -> dict:
    """An episode (:func:`transcript`) as MLflow's ``ChatAgentResponse`` messages."""
    messages: list[dict] = []
    for call_id, call in _calls(result):
        messages.append({"role": "assistant", "content": "", "id": uuid.uuid4().hex,
                         "tool_calls": [{"id": call_id, "type": "function", "function": {
                             "name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}]})
        if call["result"] is not None:
            messages.append({"role": "tool", "content": call["result"], "id": uuid.uuid4().hex,
                             "tool_call_id": call_id, "name": call["name"]})
    messages.append({"role": "assistant", "content": result["answer"] or "", "id": uuid.uuid4().hex})
    return {"messages": messages, "custom_outputs": {"finish": result["finish"], "turns": result["turns"]}}


class Agent:
    """A policy directory + the environment's resources (a dataset directory, or for the search
    agent its corpus file), acting with the settings of ``cfg`` (the run's own: environment kind
    and tools, prompt, reward, rollout engine). ``device`` None: ``cfg.device``."""

    def __init__(self, cfg: Config, policy_dir: str | Path, resources: str | Path, device: str | None = None):
        # Heavy imports here: this module is imported by the CLI's parser.
        from agentr1.env.registry import build_env
        from agentr1.device import resolve_device
        from agentr1.recipe.workspace import Workspace, make_engine
        from models.chat import ChatFormat
        from models.policy import load_actor_critic

        cfg = cfg.model_copy(update={"device": device}) if device else cfg
        resources = Path(resources)
        env = build_env(cfg, resources)
        # A Workspace without splits: the one place that says which tools the prompt shows.
        ws = Workspace(resources if resources.is_dir() else resources.parent, {}, env, resolve_device(cfg.device),
                       cfg.env.tools_in_prompt)
        self.env = env
        model, self.tokenizer = load_actor_critic(policy_dir, device=ws.device)
        self.cfg = cfg
        self.engine = make_engine(cfg, env, model, self.tokenizer, ChatFormat(self.tokenizer, ws.tools), ws.device)

    def play(self, questions: Sequence[object], temperature: float = 0.0, seed: int = 0,
             functions: Sequence[object] | None = None) -> list[tuple[str, Trajectory]]:
        """One episode per question, :data:`BATCH` at a time; greedy at ``temperature`` 0: each
        question with its trajectory. ``functions``: per question, the function documents it
        brings (:func:`check_functions`), which an agent of an environment whose questions bring
        their own (``tools_per_record``: ``function_call``) needs and any other refuses.
        ValueError (naming the row) for a bad question, before anything runs."""
        questions = check_request(questions, temperature)
        docs = self.check_functions(functions, len(questions))
        records = [question_record(q, str(i), d) for i, (q, d) in enumerate(zip(questions, docs))]
        out = []
        for start in range(0, len(records), BATCH):
            chunk = records[start: start + BATCH]
            out += [(r.question, t) for r, t in zip(chunk, self.engine.run(chunk, seed=seed + start,
                                                                           temperature=temperature))]
        return out

    def check_functions(self, functions: Sequence[object] | None, n: int) -> list[list[dict] | None]:
        """Each question's function documents (None where it brings none); ValueError naming the
        row when this agent needs them and one has none, or does not take them."""
        per_record = getattr(self.env, "tools_per_record", False)
        if functions is None:
            if per_record:
                raise ValueError(f"field {FUNCTIONS!r}: this agent calls the functions each question brings "
                                 "(--functions FILE, a 'functions' column, or the request's tools)")
            return [None] * n
        if not per_record:
            raise ValueError(f"field {FUNCTIONS!r}: this agent calls its own tools "
                             f"({', '.join(t['function']['name'] for t in self.env.tools)}), not a question's functions")
        if len(functions) != n:
            raise ValueError(f"field {FUNCTIONS!r}: {len(functions)} lists for {n} questions")
        return [check_functions(f, f"row {i}: functions") for i, f in enumerate(functions)]

    def answer(self, questions: Sequence[object], temperature: float = 0.0, seed: int = 0,
               functions: Sequence[object] | None = None) -> list[dict]:
        """:meth:`play`'s episodes as JSON-ready results (module docstring)."""
        return [transcript(q, t, self.env) for q, t in self.play(questions, temperature, seed, functions)]
