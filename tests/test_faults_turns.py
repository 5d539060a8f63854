"""Fault injection on what the policy writes: generated hostile turns (ASCII and unicode junk,
near-miss tool calls, JSON escapes of lone surrogates and special tokens, wrong types, deep
nesting, 100 kB strings) never raise, and every observation stays encodable, bounded when it
is an error, and free of chat special tokens.

Two paths, to keep the time near 15 s on two busy cores:
- 100,000 turns: parse -> environment step (real BM25) -> observation ids (the chat format's
  text, the from-scratch tokenizer), raw lone surrogates and huge strings included;
- 10,000 turns through the real engine (junk sampler ids -> decode -> step -> observation
  ids -> Trajectory), then the Parquet rollout table and ``collate``. A sampler only returns
  what ``decode`` makes, so no raw surrogate reaches this path, and a turn is at most
  ``max_turn_tokens``.

The turns come from seeded ``random.Random`` draws (not hypothesis: at this count its
per-example overhead alone would take minutes).
"""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from agentr1.env.protocol import EXCERPT_CHARS, format_answer, format_tool_call
from agentr1.rollout.backend import Generation
from agentr1.rollout.batch import collate
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from agentr1.rollout.store import read_trajectories, write_rollouts
from models.tokenizer import SPECIAL_TOKENS

FAST_TURNS = 100_000
POOL = 1_000  # episodes stepped together (one batched search per step)
ENGINE_TURNS = 10_000
EPISODES_PER_RUN = 512
COLLATE_CHUNK = 1_024
# Longest error observation: the longest fixed message plus one excerpt.
MAX_ERROR_CHARS = 120 + EXCERPT_CHARS
# Structural chat tokens each observation frame holds (<|im_start|> user, <|im_start|> assistant,
# <tool_response>, </tool_response>); a body that added one would fake a turn boundary.
FRAME_TOKENS = {"<|im_start|>": 2, "<tool_response>": 1, "</tool_response>": 1, "<|endoftext|>": 0, "<pad>": 0}

# Characters a sampler's junk is drawn from, each group repeated to about equal weight.
_ASCII = [chr(c) for c in range(0x20, 0x7F)]
_GROUPS = [
    [chr(c) for c in range(0x00, 0x20)] + ["\x7f"],
    [chr(c) for c in range(0xA0, 0x250, 5)],
    [chr(c) for c in range(0x4E00, 0x4E40, 3)] + ["\U0001f600", "\U0001f9e0", "\U00010348"],
    ["\u0301", "\u200b", "\u200d", "\u202e", "\u2028", "\ufeff", "\ufffe", "\uffff", "\U0010ffff", "\ue000"],
]
_SURROGATE_CHARS = [chr(c) for c in (0xD800, 0xDBFF, 0xDC00, 0xDFFF)]  # what no decoder returns
_ALPHABET = _ASCII + [c for g in _GROUPS for c in g * (len(_ASCII) // len(g))]
_RAW_ALPHABET = _ALPHABET + _SURROGATE_CHARS * (len(_ASCII) // len(_SURROGATE_CHARS))
_MARKUP = SPECIAL_TOKENS + ["<|fim_prefix|>", "<|vision_start|>", "<tool_call", "|>", "<|", "\\u003c|im_start|\\u003e"]
_JSON_ESCAPES = ["\\udfff", "\\ud800", "\\ud83d\\ude00", "\\u0000", "\\n", "\\\"", "\\\\", "\\u003c|im_end|\\u003e",
                 "\\u202e", "\\uffff", "\\x", "\\u12"]
_CALL = '{"name": "search", "arguments": {"query": "Q"}}'


class TurnGenerator:
    """Hostile turns drawn from a given ``random.Random``. ``raw`` adds what no sampler returns
    (raw lone surrogates) and what no turn limit lets through (100 kB strings)."""

    def __init__(self, raw: bool, names: list[str]):
        self.alphabet, self.names = (_RAW_ALPHABET if raw else _ALPHABET), names
        self.kinds = [(self.ascii_junk, 10), (self.unicode_junk, 8), (self.near_miss_call, 18),
                      (self.escaped_json, 14), (self.markup_soup, 10), (self.wrong_types, 10),
                      (self.nested, 4), (self.valid_call, 14), (self.answer, 8), (self.huge, 0.2 if raw else 0)]

    def turn(self, rng: random.Random) -> str:
        kinds, weights = zip(*self.kinds)
        return rng.choices(kinds, weights)[0](rng)

    def chars(self, rng: random.Random, n: int) -> str:
        return "".join(rng.choices(self.alphabet, k=n))

    def junk(self, rng: random.Random, n: int = 12) -> str:
        pieces = [self.chars(rng, rng.randint(0, n)), rng.choice(_MARKUP), rng.choice(_JSON_ESCAPES),
                  rng.choice(self.names), " "]
        return "".join(rng.choices(pieces, k=rng.randint(1, 4)))

    def ascii_junk(self, rng):
        return "".join(rng.choices(_ASCII + _GROUPS[0], k=rng.randint(0, 80)))

    def unicode_junk(self, rng):
        return self.chars(rng, rng.randint(0, 40))

    def near_miss_call(self, rng):
        text = format_tool_call(self.junk(rng, 6)) if rng.random() < 0.3 else f"<tool_call>{_CALL}</tool_call>"
        for _ in range(rng.randint(1, 3)):
            i = rng.randint(0, len(text))
            op = rng.randrange(5)
            if op == 0:
                text = text[:i] + text[i + 1:]
            elif op == 1:
                text = text[:i] + rng.choice(_MARKUP + list('{}[]":,\\')) + text[i:]
            elif op == 2:
                text = text[:i] + text[i:i + rng.randint(1, 12)] * 2 + text[i:]
            elif op == 3:
                text = text[:i]
            else:
                text = rng.choice(["<think>", "<think>x</think>", "", " \n"]) + text + rng.choice(
                    ["", "<|im_end|>", "<|endoftext|>", "</tool_call>", " trailing"])
        return text

    def escaped_json(self, rng):
        def s():
            return "".join(rng.choices([rng.choice(_JSON_ESCAPES), rng.choice(_MARKUP), "a", "search", "query"],
                                       k=rng.randint(1, 4))).replace('"', '\\"')
        name = rng.choice(["search", s()])
        key = rng.choice(["query", s()])
        extra = f', "{s()}": {rng.choice(["1", "null", "[]", "{}"])}' if rng.random() < 0.5 else ""
        return f'<tool_call>{{"name": "{name}", "arguments": {{"{key}": "{s()}"{extra}}}}}</tool_call>'

    def markup_soup(self, rng):
        return "".join(rng.choice([rng.choice(_MARKUP), self.junk(rng, 4), '{"name": "search"', "<answer>x"])
                       for _ in range(rng.randint(1, 8)))

    def wrong_types(self, rng):
        values = [1, -2.5e308, True, None, [], {}, ["search"], {"query": "x"}, "search", "", "   ", 1e400]
        obj = {"name": rng.choice(values + ["search"] * 4),
               "arguments": rng.choice(values + [{"query": rng.choice(values)}] * 4)}
        if rng.random() < 0.3:
            obj = rng.choice([[obj], "search", 7, None, obj["arguments"]])
        return f"<tool_call>{json.dumps(obj, allow_nan=True)}</tool_call>"

    def nested(self, rng):
        depth = rng.choice([3, 50, 999, 5_000])
        deep = "[" * depth + "]" * depth if rng.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth
        where = rng.randrange(3)
        body = ['{"name": %s, "arguments": {"query": "x"}}' % deep,
                '{"name": "search", "arguments": %s}' % deep,
                '{"name": "search", "arguments": {"query": %s}}' % deep][where]
        return f"<tool_call>{body}</tool_call>"

    def valid_call(self, rng):
        query = self.junk(rng, 20) if rng.random() < 0.5 else rng.choice(self.names) + rng.choice(["", " ", "\n"]) \
            + rng.choice(_MARKUP + _JSON_ESCAPES + [self.chars(rng, 3)])
        return format_tool_call(query) if rng.random() < 0.5 else \
            f'<tool_call>{json.dumps({"name": "search", "arguments": {"query": query}})}</tool_call>'

    def answer(self, rng):
        return rng.choice(["", "<think>" + self.junk(rng) + "</think>"]) + format_answer(self.junk(rng))

    def huge(self, rng):
        n = rng.choice([10_000, 100_000])
        big = self.chars(rng, 64) * (n // 64)
        return rng.choice([big, format_tool_call(big), format_answer(big),
                           f'<tool_call>{{"name": "search", "arguments": {{"query": "a", "{big}": 1}}}}</tool_call>',
                           f'<tool_call>{{"name": "{big}", "arguments": {{"query": "a"}}}}</tool_call>'])


class JunkBackend:
    """A sampler that writes hostile turns: a generated text's ids, or (1 in 8) uniformly random
    ids from the whole vocabulary, special tokens included; cut after the first stop token and
    at the token limit, as a real backend does."""

    def __init__(self, tok, names: list[str]):
        self.tok, self.gen, self.vocab = tok, TurnGenerator(raw=False, names=names), len(tok)

    def sync_weights(self, model):  # pragma: no cover - nothing to sync
        pass

    def generate(self, prompts, spec, seeds):
        rngs = [random.Random(seed) for seed in seeds]
        texts = [self.gen.turn(rng) for rng in rngs]
        out = []
        for rng, ids in zip(rngs, self.tok(texts, add_special_tokens=False)["input_ids"]):
            if rng.random() < 0.125:
                ids = [rng.randrange(self.vocab) for _ in range(rng.randint(1, 40))]
            stop = next((i for i, t in enumerate(ids) if t in spec.stop_token_ids), len(ids))
            ids = ids[: min(stop + 1, spec.max_new_tokens)] or [spec.stop_token_ids[0]]
            out.append(Generation(ids, [-rng.random() for _ in ids], "stop"))
        return out


def _check_observation(obs: str) -> None:
    obs.encode("utf-8")  # raises on a lone surrogate
    if obs.startswith("Error:"):
        assert len(obs) <= MAX_ERROR_CHARS and "<|" not in obs and "|>" not in obs, obs
        assert all(c.isprintable() for c in obs), repr(obs)


def _count_frame_tokens(ids: list[int], special_ids: dict[str, int], n_observations: int) -> None:
    for token, per_frame in FRAME_TOKENS.items():
        assert ids.count(special_ids[token]) == per_frame * n_observations, token


@pytest.fixture(scope="module")
def world(rollout_world):
    tok = rollout_world["tok"]
    names = sorted({d.title for d in rollout_world["env"].search.docs})
    return {**rollout_world, "names": names,
            "special_ids": {s: tok.convert_tokens_to_ids(s) for s in FRAME_TOKENS}}


@pytest.mark.slow
def test_100k_generated_turns_parse_step_and_encode(world):
    """Parse -> environment step (real BM25) -> observation ids, for turns no decoder returns
    too (raw lone surrogates, 100 kB strings, depth-5000 JSON). Observations are encoded in
    batches with the chat format's own text and tokenizer (what ``observation_ids`` encodes)."""
    chat, env, tok = world["chat"], world["env"], world["tok"]
    gen, records, rng = TurnGenerator(raw=True, names=world["names"]), world["splits"]["train"], random.Random(7)
    states = [env.reset(records[i % len(records)]) for i in range(POOL)]
    kinds, turns, seen = Counter(), 0, set()
    while turns < FAST_TURNS:
        texts = [gen.turn(rng) for _ in states]
        results = env.step_batch(states, texts)
        turns += len(states)
        kinds.update(res.observation[:5] for res in results if res.observation is not None)
        # Tokenizing is deterministic: each distinct observation is checked and encoded once
        # (the same few error messages make up most of them).
        new = {res.observation for res in results if res.observation is not None} - seen
        seen |= new
        for obs in new:
            _check_observation(obs)
        if new:
            ids = tok([chat.observation_text(b, turn_closed=False) for b in new], add_special_tokens=False)
            _count_frame_tokens([i for row in ids["input_ids"] for i in row], world["special_ids"], len(new))
        states = [s if not s.done else env.reset(records[rng.randrange(len(records))]) for s in states]
    # every kind of observation was exercised: errors, documents and empty searches
    assert kinds["Error"] > 0.3 * turns and kinds["Doc 1"] > 0.02 * turns and kinds["No do"] > 0.02 * turns, kinds


@pytest.mark.slow
def test_hostile_turns_through_the_rollout_engine_into_the_rollout_table(world, tmp_path):
    """The real engine with a junk sampler, then the Parquet rollout table and collate."""
    chat, tok = world["chat"], world["tok"]
    engine = RolloutEngine(JunkBackend(tok, world["names"]), chat, tok, world["env"],
                           RolloutSettings(max_turn_tokens=256, max_context_tokens=1_024))
    records = world["splits"]["train"]
    trajs, turns, run = [], 0, 0
    while turns < ENGINE_TURNS:
        batch = engine.run([records[(run + i) % len(records)] for i in range(EPISODES_PER_RUN)], seed=run)
        turns += sum(len(t.turn_ends) for t in batch)
        trajs += batch
        run += 1
    for t in trajs:
        assert len(t.token_ids) == len(t.action_mask) == len(t.rollout_logprobs) and t.turn_ends
        env_ids = [i for i, m in zip(t.token_ids[t.prompt_len:], t.action_mask[t.prompt_len:]) if m == 0]
        _count_frame_tokens(env_ids, world["special_ids"], len(t.observations))
        for obs in t.observations:
            _check_observation(obs)
    assert {"answer", "max_turns"} <= {t.finish for t in trajs}

    info = write_rollouts(trajs, tmp_path / "rollouts.parquet", iteration=0, meta={"test": "faults"})
    back = read_trajectories(info.path)
    assert [(b.token_ids, b.observations, b.turn_texts) for b in back] == \
        [(t.token_ids, t.observations, t.turn_texts) for t in trajs]
    for i in range(0, len(back), COLLATE_CHUNK):
        chunk = back[i: i + COLLATE_CHUNK]
        assert int(collate(chunk, chat.pad_token_id).action_mask.sum()) == sum(t.n_action_tokens for t in chunk)
