"""The trained policy in the OpenAI chat-completions protocol: one assistant turn per request.

An OpenAI client holds the conversation and runs the tools: it sends ``messages`` (and usually
``tools``), the model answers either with ``tool_calls`` (``finish_reason: "tool_calls"``) or with
its answer as ``content`` (``"stop"``), the client appends the call and a ``tool`` message with
the result, and asks again. This module maps such a conversation onto the token sequence the
policy was trained on, with the run's own chat format (:class:`models.chat.ChatFormat`):

- the episode's system turn is the run's own (what the policy was trained with); a ``system``
  message in the request replaces it (an empty one removes it);
- the first ``user`` message is the question (text, or a list of ``{"type": "text"}`` parts);
- an ``assistant`` message with one tool call becomes that call in the training format
  (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, Hermes style), one with
  ``content`` the answer (``<answer>...</answer>``) unless it is already a tagged turn;
- ``tool`` messages become observations, as the environment's would be (several after one
  call are joined by a blank line).
- for a function-calling model (``env.kind: function_call``), the request's ``tools`` are the
  question's functions: the system turn lists them as in training (after the request's own
  system message, if any), and the model answers with one call of one of them.

The policy makes one call per turn (the protocol it was trained on), so an assistant message
with several tool calls, a second ``user`` message, or messages out of this order are refused
with :class:`ChatRequestError` naming the message, which a server answers with HTTP 400. The
turn the policy writes is read by the environment's own parser (:meth:`Environment.parse`): a
well-formed call of a tool the request offers (any tool when it offers none) is returned as
``tool_calls``; an answer as ``content``; anything else as the raw text, ``finish_reason``
``"length"`` when the turn ran out of tokens and ``"stop"`` otherwise.
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentr1.agent import check_functions, question_record
from agentr1.data.records import unencodable
from agentr1.env.protocol import ANSWER_START, TOOL_CALL_START, format_answer, format_call

if TYPE_CHECKING:
    from agentr1.agent import Agent

MAX_MESSAGES = 64
"""More than the longest episode a run allows (``env.max_turns`` is at most a few dozen)."""
MAX_CONTENT_CHARS = 100_000
"""A message's text beyond this is refused (the context holds ~1,000 tokens)."""


class ChatRequestError(ValueError):
    """A request this model cannot answer as asked; the message names the field."""


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (OpenAI's content parts)."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                           and isinstance(p.get("text"), str) for p in content):
        text = "".join(p["text"] for p in content)
    else:
        raise ChatRequestError(f"{where}.content must be a string or a list of text parts")
    if len(text) > MAX_CONTENT_CHARS:
        raise ChatRequestError(f"{where}.content has {len(text)} characters; at most {MAX_CONTENT_CHARS}")
    if unencodable(text) is not None:
        raise ChatRequestError(f"{where}.content is not valid Unicode text (a lone surrogate)")
    return text


def _call_turn(message: Mapping, where: str) -> str:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or len(calls) != 1:
        raise ChatRequestError(f"{where}.tool_calls: this model makes exactly one call per turn "
                               f"(got {len(calls) if isinstance(calls, list) else type(calls).__name__})")
    function = calls[0].get("function") if isinstance(calls[0], Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ChatRequestError(f"{where}.tool_calls[0].function.name must be a string")
    arguments = function.get("arguments", "{}")
    for field, value in (("name", function["name"]), ("arguments", arguments)):
        size = len(value) if isinstance(value, str) else len(json.dumps(value, default=str)) if value else 0
        if size > MAX_CONTENT_CHARS:  # tokenised whole before the context check: bounded like content
            raise ChatRequestError(f"{where}.tool_calls[0].function.{field} has {size} characters; "
                                   f"at most {MAX_CONTENT_CHARS}")
        if isinstance(value, str) and unencodable(value) is not None:
            raise ChatRequestError(f"{where}.tool_calls[0].function.{field} is not valid Unicode text")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError as err:  # JSONDecodeError, and an integer over Python's digit limit
        raise ChatRequestError(f"{where}.tool_calls[0].function.arguments is not JSON "
                               f"({getattr(err, 'msg', err)})") from None
    except RecursionError:
        raise ChatRequestError(f"{where}.tool_calls[0].function.arguments is nested too deeply") from None
    if not isinstance(arguments, dict):
        raise ChatRequestError(f"{where}.tool_calls[0].function.arguments must be a JSON object")
    return format_call(function["name"], arguments)


def episode(messages: Sequence[Any]) -> tuple[str | None | bool, str, list[tuple[str, str | None]]]:
    """``(system, question, turns)`` of a conversation: ``system`` False when the request has no
    system message (the run's own is used), else its text (None: empty, no system turn);
    ``turns`` the assistant turns in the training format, each with its observation (None for a
    last turn the client has not answered). ChatRequestError names the first bad message."""
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("messages must be a non-empty list")
    if len(messages) > MAX_MESSAGES:
        raise ChatRequestError(f"messages: {len(messages)}; at most {MAX_MESSAGES}")
    system: str | None | bool = False
    question: str | None = None
    turns: list[tuple[str, str | None]] = []
    observations: list[str] = []

    def close_turn() -> None:
        if turns and observations:
            turns[-1] = (turns[-1][0], "\n\n".join(observations))
            observations.clear()

    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, Mapping) else None
        if role in ("system", "developer") and i == 0:
            system = _text(m.get("content", ""), where) or None
        elif role == "user" and question is None:
            question = _text(m.get("content"), where)
            if not question.strip():
                raise ChatRequestError(f"{where}.content is empty")
        elif role == "assistant" and question is not None and (not turns or turns[-1][1] is not None):
            if m.get("tool_calls"):
                turns.append((_call_turn(m, where), None))
            else:
                text = _text(m.get("content") or "", where).strip()
                turns.append((text if text.startswith((TOOL_CALL_START, ANSWER_START)) else format_answer(text), None))
        elif role == "tool" and turns and turns[-1][1] is None and not turns[-1][0].startswith(ANSWER_START):
            observations.append(_text(m.get("content"), where))
            if i + 1 == len(messages) or (isinstance(messages[i + 1], Mapping) and messages[i + 1].get("role") != "tool"):
                close_turn()
        else:
            expected = ("a user message (the question)" if question is None else
                        "nothing after the answer" if turns and turns[-1][0].startswith(ANSWER_START) else
                        "a tool message answering the last call" if turns and turns[-1][1] is None else
                        "an assistant message")
            raise ChatRequestError(f"{where}.role: {role!r} here; expected {expected} (this model answers one "
                                   "question per conversation: [system], user, then assistant and tool messages)")
    if question is None:
        raise ChatRequestError("messages: no user message (the question)")
    if turns and turns[-1][1] is None:
        raise ChatRequestError(f"messages[{len(messages) - 1}]: the conversation ends with the model's own turn; "
                               "send the tool's result (a tool message) or start a new conversation")
    return system, question, turns


def tool_names(tools: Any) -> set[str] | None:
    """The function names a request offers (None: it offers none, so any trained tool may be called)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatRequestError("tools must be a list")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ChatRequestError(f"tools[{i}].function.name must be a string")
        names.add(fn["name"])
    return names or None


class ChatCompletions:
    """Answers chat-completion requests with an :class:`~agentr1.agent.Agent`'s policy, one turn
    a request (module docstring); requests are served one at a time (the policy is one model)."""

    def __init__(self, agent: Agent, model_name: str):
        self.agent, self.model_name = agent, model_name
        self._lock = threading.Lock()

    def _prompt(self, messages: Sequence[Any], tools: Any = None) -> list[int]:
        engine = self.agent.engine
        system, question, turns = episode(messages)
        chat, env = engine.chat, self.agent.env
        limit = getattr(getattr(env, "settings", None), "max_turns", None)
        if limit is not None and len(turns) >= limit:  # the next turn would be one more than training allowed
            raise ChatRequestError(f"messages: the conversation holds {len(turns)} assistant turns; this model "
                                   f"answers within {limit} (env.max_turns): start a new conversation")
        # The question as every episode puts it (the environment's user prompt), as in training,
        # `agentr1 ask` and the MLflow model.
        if getattr(env, "tools_per_record", False):  # a function caller: the request's tools are the question's
            if not tools:
                raise ChatRequestError("tools: this model calls the functions a request offers; give them")
            try:
                functions = check_functions(tools, "tools")
            except ValueError as err:
                raise ChatRequestError(str(err)) from None
            record = question_record(question, functions=functions, system=system or None)
            ids = list(chat.prompt_ids(env.system_turn(record), env.user_prompt(record)))
        else:
            ids = list(chat.prompt_ids(env.system_turn() if system is False else system,
                                       env.user_prompt(question_record(question))))
        for text, observation in turns:
            turn = chat.turn_ids(text)
            ids += turn
            if observation is not None:
                ids += chat.observation_ids(observation, turn_closed=chat.is_closed(turn))
        return ids

    def create(self, request: Mapping[str, Any]) -> dict:
        """The chat-completion object for ``request`` (OpenAI's fields: ``messages``, ``tools``,
        ``temperature`` (default 0: greedy), ``top_p``, ``max_tokens``/``max_completion_tokens``,
        ``seed``); ChatRequestError for a request it cannot answer."""
        from agentr1.rollout.backend import SamplingSpec

        if not isinstance(request, Mapping):
            raise ChatRequestError("the request body must be a JSON object")
        offered = tool_names(request.get("tools"))
        settings = self.agent.engine.settings

        def given(key: str, default: Any) -> Any:  # a null field is an unset one, as in OpenAI's API
            value = request.get(key)
            return default if value is None else value

        temperature = given("temperature", 0.0)
        top_p = given("top_p", settings.top_p)  # the run's, as `agentr1 ask` samples
        seed = given("seed", 0)
        limit = given("max_completion_tokens", request.get("max_tokens"))
        for name, value, ok in (("temperature", temperature, lambda v: 0 <= v <= 2),
                                ("top_p", top_p, lambda v: 0 < v <= 1),
                                # a seed torch can take (JSON 1e20 is an integral float)
                                ("seed", seed, lambda v: v == int(v) and 0 <= v < 2**63),
                                ("max_tokens", limit, lambda v: v == int(v) and v >= 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not (isinstance(value, int) or math.isfinite(value)) or not ok(value)):
                raise ChatRequestError(f"{name}: {value!r} is out of range")
        if given("n", 1) != 1:
            raise ChatRequestError("n: this model returns one choice")
        if not isinstance(given("stream", False), bool):  # "yes" or 1 is not OpenAI's boolean
            raise ChatRequestError(f"stream: must be true or false, got {request.get('stream')!r}")
        prompt = self._prompt(request.get("messages"), request.get("tools"))  # ChatFormat encodes one at a time
        room = settings.max_context_tokens - len(prompt)
        if room < 1:
            raise ChatRequestError(f"messages: {len(prompt)} tokens fill the model's context of "
                                   f"{settings.max_context_tokens}")
        max_new = min(settings.max_turn_tokens, room, int(limit) if limit is not None else settings.max_turn_tokens)
        engine = self.agent.engine
        spec = SamplingSpec(max_new, tuple(engine.chat.stop_token_ids), float(temperature), float(top_p))
        with self._lock:
            session = getattr(engine.backend, "session", None)
            with session() if session else contextlib.nullcontext():
                generation = engine.backend.generate([prompt], spec, [int(seed)])[0]
        text = engine.chat.strip_markers(engine.tokenizer.decode(generation.token_ids, skip_special_tokens=False))
        return self._completion(text, len(prompt), generation.token_ids, max_new, offered)

    def _completion(self, text: str, prompt_tokens: int, token_ids: list[int], max_new: int,
                    offered: set[str] | None) -> dict:
        turn = self.agent.env.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if turn.kind == "tool_call" and (offered is None or turn.name in offered):
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                      "function": {"name": turn.name,
                                                   "arguments": json.dumps(turn.arguments, ensure_ascii=False)}}]
            finish = "tool_calls"
        elif turn.kind == "answer":
            message["content"], finish = turn.answer, "stop"
        else:  # not a call or an answer the client can use: the text itself
            message["content"] = text.strip()
            closed = self.agent.engine.chat.is_closed(token_ids)
            finish = "length" if not closed and len(token_ids) >= max_new else "stop"
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(token_ids),
                          "total_tokens": prompt_tokens + len(token_ids)}}


def stream_chunks(completion: dict) -> list[dict]:
    """``completion`` as the ``chat.completion.chunk`` objects of a streamed response: the role,
    the content or the tool call, then the finish reason (the turn is generated whole first)."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    delta: dict[str, Any] = {"role": "assistant"}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": 0, **call} for call in message["tool_calls"]]
    else:
        delta["content"] = message["content"] or ""
    return [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
