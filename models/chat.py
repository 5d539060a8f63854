"""Token-level pieces of a multi-turn tool-use chat, derived from the tokenizer's own template.

The rollout engine never re-tokenises a whole conversation: it appends the ids the policy
sampled (``turn_ids`` reproduces them for scripted turns) and the ids the environment
inserts (``observation_ids``). Those environment pieces are found by rendering the chat
template (``apply_chat_template(tokenize=False)``) for a conversation with and without a
tool message and taking the string difference, so the same code serves our template and a
real Qwen2.5 one.

Sequence layout (``action_mask`` in brackets):
    prompt_ids [0] | turn_ids(t1) [1] | observation_ids(o1) [0] | turn_ids(t2) [1] | ...

Three things depend on the vocabulary and template, and are decided here once:

* **Who closes a turn.** Where ``</tool_call>`` and ``</answer>`` are single tokens (the
  from-scratch vocabulary), a turn stops at them and the end-of-turn token is environment text.
  Where they are several tokens (SmolLM2, most pretrained vocabularies), a turn ends with the
  model's own end-of-turn token (``<|im_end|>``), which it samples and which is then an action
  token: ``closes_turns``. Both stop on single token ids, so every backend stops the same way.
* **Where tool schemas go.** A template that renders ``tools=`` (Qwen2.5, the from-scratch one)
  gets them; one that ignores them (SmolLM2's ChatML) gets them in the system message, in the
  Hermes layout Qwen2.5's template writes (``hermes_tools_block``), which vLLM's hermes tool
  parser reads back.
* **Environment text is data.** An observation's body (a tool result, a document), the question
  and the system prompt are encoded with special-token parsing off (``split_special_tokens``): a
  document or a question that contains ``<|im_end|>`` or ``<answer>`` gives the pieces of that
  text, never the control token, so nothing a tool returns or a user asks can end a turn, open
  a new one or fake an answer. Markup tokens a
  vocabulary adds without the special flag (Qwen2.5's ``<tool_call>``, ``</tool_response>``),
  which that switch leaves whole, are cut into their characters.
"""

from __future__ import annotations

import re
import threading

from transformers import PreTrainedTokenizerBase

from agentr1.env.protocol import hermes_tools_block
from models.tokenizer import single_token_ids


def _plain_markup_pattern(tokenizer: PreTrainedTokenizerBase) -> re.Pattern | None:
    """A pattern matching the markup tokens (``<...>``) the vocabulary added without the special
    flag, as a capturing group (None: there are none). A from-scratch vocabulary's phrases
    (tool-call JSON) are not markup."""
    special = set(tokenizer.all_special_tokens)
    plain = sorted((t for t in tokenizer.get_added_vocab() if len(t) > 1 and t[0] == "<" and t[-1] == ">"
                    and t not in special), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, plain)) + ")") if plain else None


# Placeholders for the string diffs; plain text that no template rewrites.
_TURN_SENTINEL = "TURNSENTINEL"
_BODY_SENTINEL = "BODYSENTINEL"
_SYSTEM_PROBE = "SYSTEMPROBE"
_USER_PROBE = "USERPROBE"
_TOOL_PROBE = "TOOLPROBE"
# Action strings at which a turn ends (the policy stops generating there).
STOP_STRINGS = ("</tool_call>", "</answer>")


class ChatFormat:
    """Builds token ids of prompts, assistant turns and tool observations for one tokenizer.

    Attributes:
        stop_token_ids: the end-of-turn token and eos, and ``</tool_call>``, ``</answer>`` where
            both are single tokens (else the policy closes its turns: ``closes_turns``).
        stop_strings: ``("</tool_call>", "</answer>")``.
        pad_token_id: the tokenizer's pad id (eos when it has none).
        end_of_turn_id: id the template closes an assistant message with (``<|im_end|>``).
        closes_turns: the policy ends each turn with ``end_of_turn_id`` itself (an action token),
            because the action end tags are not single tokens in this vocabulary.
        tools_in_system: the tool schemas are written into the system message (the template
            ignores ``tools=``).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None):
        if not tokenizer.chat_template:
            raise ValueError(f"{type(tokenizer).__name__} has no chat_template: ChatFormat needs one")
        self.tokenizer = tokenizer
        # One encoding at a time: a fast tokenizer's split_special_tokens is a switch on the shared
        # Rust tokenizer, so a server's concurrent requests (the OpenAI endpoint's thread pool,
        # MLflow's scoring server) could encode a prompt's control tokens as text, or a tool
        # result's as control tokens.
        self._lock = threading.RLock()
        self.tools = tools
        self.tools_in_system = bool(tools) and not self._template_renders_tools()
        self._obs_before, self._obs_after = self._observation_frame()
        self.end_of_turn_id: int = self._encode(self._obs_before)[0]
        self._end_of_turn = tokenizer.convert_ids_to_tokens(self.end_of_turn_id)
        if not self._obs_before.startswith(self._end_of_turn):
            raise ValueError(f"chat_template: an assistant turn is not closed by a single token: {self._obs_before!r}")
        self._frame_ids, self._data_head, self._data_tail = self._split_frame()
        self.stop_strings = STOP_STRINGS
        self.closes_turns = len(single_token_ids(tokenizer, STOP_STRINGS)) < len(STOP_STRINGS)
        self.stop_token_ids: list[int] = single_token_ids(
            tokenizer, [*(() if self.closes_turns else STOP_STRINGS), self._end_of_turn, tokenizer.eos_token]
        )
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = pad if pad is not None else tokenizer.eos_token_id
        # Chat-end and padding tokens a sampled turn may hold; they carry no meaning for the action.
        self._markers = tuple(dict.fromkeys(m for m in (self._end_of_turn, tokenizer.eos_token, tokenizer.pad_token,
                                                         tokenizer.unk_token) if m))
        self._plain_markup = _plain_markup_pattern(tokenizer)
        added = sorted((t for t in tokenizer.get_added_vocab() if t), key=len, reverse=True)
        self._added = re.compile("(" + "|".join(map(re.escape, added)) + ")") if added else None

    # -- rendering ---------------------------------------------------------------------------
    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        tools = None if self.tools_in_system else self.tools
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _template_renders_tools(self) -> bool:
        probe = [{"type": "function", "function": {"name": _TOOL_PROBE, "description": "", "parameters": {}}}]
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": _USER_PROBE}], tools=probe,
                                                  tokenize=False, add_generation_prompt=True)
        return _TOOL_PROBE in text

    def _encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_data(self, texts: list[str]) -> list[list[int]]:
        """Environment text as plain text: special-token strings inside it stay ordinary pieces,
        and so do added tokens that are not marked special (Qwen2.5's ``<tool_call>``,
        ``</tool_response>``), which ``split_special_tokens`` leaves whole."""
        if not texts:
            return []
        with self._lock:
            enc = [list(x) for x in self.tokenizer(texts, add_special_tokens=False,
                                                   split_special_tokens=True)["input_ids"]]
        if self._plain_markup is not None:
            for k, text in enumerate(texts):
                if self._plain_markup.search(text):
                    enc[k] = self._encode_pieces(self._plain_markup.split(text))
        return enc

    def _encode_pieces(self, parts: list[str]) -> list[int]:
        """``parts`` of ``re.split`` (odd ones are markup-token strings), each markup token
        encoded character by character, so it can never become the token itself."""
        pieces = [q for k, part in enumerate(parts) for q in (list(part) if k % 2 else [part]) if q]
        ids: list[int] = []
        with self._lock:
            encoded = self.tokenizer(pieces, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        for x in encoded:
            ids.extend(x)
        return ids

    def _head(self, system: str | None, user: str) -> list[dict]:
        if self.tools_in_system:
            block = hermes_tools_block(self.tools)
            system = block if not system else f"{system}\n\n{block}"
        head = [{"role": "system", "content": system}] if system is not None else []
        return [*head, {"role": "user", "content": user}]

    def _observation_frame(self) -> tuple[str, str]:
        """Text the template puts between an assistant turn's content and the next assistant
        header, split around the tool message body: ``(before, after)``."""
        head = self._head(_SYSTEM_PROBE, _USER_PROBE)
        prefix = self._render(head, True) + _TURN_SENTINEL
        turn = {"role": "assistant", "content": _TURN_SENTINEL}
        full = self._render([*head, turn, {"role": "tool", "content": _BODY_SENTINEL}], True)
        if not full.startswith(prefix) or full.count(_BODY_SENTINEL) != 1:
            raise ValueError(
                "chat_template: rendering [system, user, assistant, tool] does not extend the rendered "
                f"prompt + assistant content as plain text; cannot derive observation tokens:\n{full!r}"
            )
        before, after = full[len(prefix):].split(_BODY_SENTINEL)
        return before, after

    def _split_frame(self) -> tuple[tuple[list[int], list[int], list[int]], str, str]:
        """The observation frame cut where its last (first) added token ends (starts): the token
        parts as ids (``before``, ``before`` after a closed turn, ``after``), and the plain text on
        each side of the body, which is encoded together with it."""
        added = [t for t in self.tokenizer.get_added_vocab() if t]
        before, after = self._obs_before, self._obs_after
        cut_b = max((before.rfind(t) + len(t) for t in added if t in before), default=0)
        cut_a = min((after.find(t) for t in added if t in after), default=len(after))
        eot = len(self._end_of_turn)
        if cut_b < eot:
            raise ValueError(f"chat_template: the observation frame {before!r} does not open with an added token")
        ids = self._encode_many([before[:cut_b], before[eot:cut_b], after[cut_a:]])
        return (ids[0], ids[1], ids[2]), before[cut_b:], after[:cut_a]

    # -- public pieces -----------------------------------------------------------------------
    def prompt_text(self, system: str | None, user: str) -> str:
        """System (with tools) + user message + assistant header, as the template renders it."""
        return self._render(self._head(system, user), True)

    def prompt_ids(self, system: str | None, user: str) -> list[int]:
        """Ids of ``prompt_text``; ends with the assistant header. ``system=None`` leaves the
        system message out (a template may then insert its default one). The system and user
        text are data, like an observation's body: a special token or a markup token spelled
        inside them stays plain text (:meth:`_prompts`)."""
        return self._prompts([(system, user)])[0]

    def _prompts(self, items: list[tuple[str | None, str]]) -> list[list[int]]:
        """``prompt_ids`` of many ``(system, user)``: the template is rendered with placeholders
        for the two texts and cut at its added tokens; a plain piece that holds a placeholder is
        encoded, the texts put back, with special-token parsing off (:meth:`_encode_data`), every
        other piece as the template's own. The tokenizer cuts text at its added tokens before
        anything else, so these are the ids of encoding the whole prompt at once, except that a
        question or a system prompt can never spell a control token (``<|im_end|>``) into it."""
        pieces, data, where = [], [], []
        for system, user in items:
            frame = self.prompt_text(_SYSTEM_PROBE if system else system, _USER_PROBE)
            parts = self._added.split(frame) if self._added else [frame]
            where.append([])
            for k, part in enumerate(parts):
                if k % 2 == 0 and (_SYSTEM_PROBE in part or _USER_PROBE in part):
                    where[-1].append(("data", len(data)))
                    data.append(part.replace(_SYSTEM_PROBE, system or "").replace(_USER_PROBE, user))
                elif part:
                    where[-1].append(("frame", len(pieces)))
                    pieces.append(part)
        frame_ids, data_ids = self._encode_many(pieces), self._encode_data(data)
        return [[i for kind, n in spots for i in (data_ids if kind == "data" else frame_ids)[n]] for spots in where]

    def turn_ids(self, text: str) -> list[int]:
        """An assistant turn encoded on its own, as the policy emits it (no specials added; with
        ``closes_turns``, ending with the end-of-turn token the policy samples)."""
        return self._encode_many([self.turn_text(text)])[0]

    def prefix_ids(self, text: str) -> list[int]:
        """The start of an assistant turn the policy continues (never closed), e.g. ``<answer>``."""
        return self._encode_many([text])[0]

    def turn_text(self, text: str) -> str:
        """A scripted turn as the policy writes it: with ``closes_turns``, closed by end of turn."""
        return text + self._end_of_turn if self.closes_turns and not text.endswith(self._end_of_turn) else text

    def observation_text(self, body: str, turn_closed: bool) -> str:
        """Environment text after an assistant turn: end of turn (unless the policy closed it),
        the tool message holding ``body``, and the next assistant header."""
        text = self._obs_before + body + self._obs_after
        return text[len(self._end_of_turn):] if turn_closed else text

    def observation_ids(self, body: str, turn_closed: bool) -> list[int]:
        """Ids between the end of an assistant turn and the next assistant header: the frame
        (end of turn unless ``turn_closed``, the tool message's header and footer, the next
        assistant header) as the template's tokens, ``body`` as plain text (see the module
        docstring). ``turn_closed``: the turn's last sampled token was already the end-of-turn
        token, so it is not inserted again."""
        return self._observations([(body, turn_closed)])[0]

    def _observations(self, items: list[tuple[str, bool]]) -> list[list[int]]:
        """``observation_ids`` of many ``(body, turn_closed)`` in one tokenizer call for the bodies.

        The tokenizer cuts text at its added tokens before anything else, so the frame's text
        next to the body (``tool\n`` in ChatML, ``\n`` inside ``<tool_response>``) is encoded in one
        piece with the body, with special-token parsing off: the same ids as encoding the whole
        observation at once, except that a special token inside the body stays plain text."""
        bodies = self._encode_data([self._data_head + body + self._data_tail for body, _ in items])
        open_, open_closed, close = self._frame_ids
        return [(open_closed if closed else open_) + b + close for (_, closed), b in zip(items, bodies)]

    def strip_markers(self, text: str) -> str:
        """A sampled turn's text without end-of-turn, eos, pad and unk token strings."""
        for marker in self._markers:
            text = text.replace(marker, "")
        return text

    def is_closed(self, turn: list[int]) -> bool:
        """Whether a turn's ids already end with the end-of-turn token."""
        return bool(turn) and turn[-1] == self.end_of_turn_id

    def encode_episode(
        self, system: str | None, user: str, turns: list[str], observations: list[str]
    ) -> tuple[list[int], list[int]]:
        """Token ids and action mask of a whole episode, for supervised warm-up.

        ``observations[i]`` (a tool message body) follows ``turns[i]``; the last turn ends the
        sequence, so ``len(observations) == len(turns) - 1``. Returns ``(ids, action_mask)``,
        both of length L, mask 1 on assistant-turn tokens and 0 on prompt/observation tokens.
        """
        return self.encode_episodes([(system, user, turns, observations)])[0]

    def encode_episodes(
        self, episodes: list[tuple[str | None, str, list[str], list[str]]]
    ) -> list[tuple[list[int], list[int]]]:
        """:meth:`encode_episode` for many ``(system, user, turns, observations)`` at once.

        Every piece is encoded on its own exactly as in a rollout, but in two batched tokenizer
        calls (prompts and turns, then observations), ~4x faster than piece by piece.
        """
        for _, _, turns, observations in episodes:
            if not turns or len(observations) != len(turns) - 1:
                raise ValueError(
                    f"encode_episode: {len(turns)} turns need {max(len(turns) - 1, 0)} observations, "
                    f"got {len(observations)} (and at least one turn)"
                )
        heads = self._prompts([(system, user) for system, user, _, _ in episodes])
        turn_ids = iter(self._encode_many([self.turn_text(t) for _, _, turns, _ in episodes for t in turns]))
        turns_per_episode = [[next(turn_ids) for _ in turns] for _, _, turns, _ in episodes]
        obs_ids = iter(self._observations([
            (body, self.is_closed(t))
            for (_, _, _, observations), ts in zip(episodes, turns_per_episode)
            for body, t in zip(observations, ts)
        ]))
        out = []
        for head, ts in zip(heads, turns_per_episode):
            ids, mask = list(head), [0] * len(head)
            for i, t in enumerate(ts):
                ids += t
                mask += [1] * len(t)
                if i < len(ts) - 1:
                    o = next(obs_ids)
                    ids += o
                    mask += [0] * len(o)
            out.append((ids, mask))
        return out

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        with self._lock:
            return [list(x) for x in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
