"""Scripted agents on the real synthetic world and the real BM25 index."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from agentr1.env.qa import synth
from agentr1.env import agents
from agentr1.env.agents import ExpertNoise, NoisyExpertAgent, OracleAgent
from agentr1.env.episodes import chat_messages, run_episode, run_episodes
from agentr1.env.protocol import TOOL_RESPONSE_START, parse_turn
from agentr1.config import EnvConfig, RewardConfig
from agentr1.env.qa.env import EnvSettings, QAEnv
from agentr1.env.rewards import RewardWeights
from agentr1.env.qa.search import SearchIndex

CLEAN = ExpertNoise(stop_short_3hop=0.0, distractor=0.0, malformed=0.0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    splits, corpus = synth.generate(0, n_train=50, n_dev=20, n_test=200)
    index = SearchIndex.build(corpus, cache_dir=tmp_path_factory.mktemp("index"))
    return splits["test"], index


def _env(index, top_k: int = 1, max_turns: int = 4) -> QAEnv:
    return QAEnv(index, EnvSettings.from_config(EnvConfig(top_k=top_k, max_turns=max_turns, doc_header=True,
                                                          system_prompt=None)),
                 RewardWeights.from_config(RewardConfig()))


def _em_by_hops(records, transcripts) -> dict[int, float]:
    by = defaultdict(list)
    for record, transcript in zip(records, transcripts):
        by[record.hops].append(transcript.metrics["em"])
    return {hops: sum(v) / len(v) for hops, v in sorted(by.items())}


def _answer(transcript) -> str | None:
    return parse_turn(transcript.turn_texts[-1]).answer


def test_world_has_every_hop_count(world):
    records, _ = world
    assert {r.hops for r in records} == {1, 2, 3}


@pytest.mark.parametrize("top_k", [1, 3])
def test_oracle_solves_every_question_through_search(world, top_k):
    records, index = world
    transcripts = run_episodes(_env(index, top_k), OracleAgent(), records)
    assert [t.metrics["em"] for t in transcripts] == [1.0] * len(records)
    for record, t in zip(records, transcripts):
        assert t.metrics["support_recall"] == 1.0 and t.metrics["n_bad_calls"] == 0.0
        assert t.metrics["n_calls"] == record.hops and t.outcome_reward == pytest.approx(1.1)
        if top_k == 1:  # each hop retrieves its own supporting doc, first time
            assert t.process_rewards == pytest.approx([0.2] * record.hops + [0.0])


def test_oracle_needs_no_answers_from_meta(world):
    """Only the hop-0 entity (in the question) and the relation names are left in meta."""
    records, index = world
    stripped = [
        dataclasses.replace(r, meta={"chain": [
            {"query": h["query"] if i == 0 else None, "relation": h["relation"]}
            for i, h in enumerate(r.meta["chain"])
        ]})
        for r in records
    ]
    transcripts = run_episodes(_env(index), OracleAgent(), stripped)
    assert sum(t.metrics["em"] for t in transcripts) == len(records)


def test_transcript_is_a_chat(world):
    records, index = world
    env = _env(index)
    t = run_episode(env, OracleAgent(), records[0])
    messages = chat_messages(env.system_prompt(), env.user_prompt(records[0]), t)
    roles = [m["role"] for m in messages]
    assert roles[:2] == ["system", "user"] and messages[0]["content"] == env.system_prompt()
    assert messages[1]["content"] == env.user_prompt(records[0])
    assert roles[2:] == ["assistant", "tool"] * len(t.observations) + ["assistant"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == t.observations
    assert [m["content"] for m in messages if m["role"] == "assistant"] == t.turn_texts
    assert t.record_id == records[0].id and t.token_ids == [] and t.rollout_logprobs == []  # text only
    assert all(not o.startswith(TOOL_RESPONSE_START) for o in t.observations)  # the template wraps
    assert len(t.turn_texts) == len(t.process_rewards) == len(t.observations) + 1
    assert t == run_episodes(env, OracleAgent(), records[:1])[0]


def test_noisy_expert_defaults_are_systematically_wrong_on_three_hops(world):
    records, index = world
    transcripts = run_episodes(_env(index), NoisyExpertAgent(ExpertNoise()), records)
    em = _em_by_hops(records, transcripts)
    assert em[1] >= 0.6 and em[2] >= 0.5
    assert em[3] <= 0.35  # one hop short 70% of the time, plus distractor copies
    three = [(r, t) for r, t in zip(records, transcripts) if r.hops == 3]
    short = sum(_answer(t) == r.meta["chain"][1]["answer"] for r, t in three) / len(three)
    assert 0.45 <= short <= 0.85, short  # the most common 3-hop demonstration is wrong
    assert sum(t.metrics["n_bad_calls"] for t in transcripts) > 0


def _chat(t) -> tuple[list[str], list[str]]:
    return t.turn_texts, t.observations


def test_noisy_expert_is_deterministic_per_seed_and_record(world):
    records, index = world
    env = _env(index)
    first = run_episodes(env, NoisyExpertAgent(ExpertNoise(seed=3)), records)
    again = run_episodes(env, NoisyExpertAgent(ExpertNoise(seed=3)), records[::-1])[::-1]
    assert [_chat(t) for t in first] == [_chat(t) for t in again]
    other = run_episodes(env, NoisyExpertAgent(ExpertNoise(seed=4)), records)
    assert sum(_chat(a) != _chat(b) for a, b in zip(first, other)) > len(records) // 10


def test_noisy_expert_without_noise_is_the_oracle(world):
    records, index = world
    env = _env(index)
    noisy = run_episodes(env, NoisyExpertAgent(CLEAN), records)
    assert [_chat(t) for t in noisy] == [_chat(t) for t in run_episodes(env, OracleAgent(), records)]


def test_stop_short_answers_the_hop_two_value(world):
    records, index = world
    transcripts = run_episodes(_env(index), NoisyExpertAgent(dataclasses.replace(CLEAN, stop_short_3hop=1.0)), records)
    for record, t in zip(records, transcripts):
        if record.hops == 3:
            assert _answer(t) == record.meta["chain"][1]["answer"] and t.metrics["n_calls"] == 2
            assert t.metrics["em"] == 0.0
        else:
            assert t.metrics["em"] == 1.0


def test_distractor_copies_the_distractor_value(world):
    records, index = world
    transcripts = run_episodes(_env(index), NoisyExpertAgent(dataclasses.replace(CLEAN, distractor=1.0)), records)
    for record, t in zip(records, transcripts):
        if record.hops == 1:
            assert _answer(t) == record.meta["chain"][0]["distractor_answer"]
        assert t.metrics["em"] == 0.0


@pytest.mark.parametrize("variant", range(len(agents._MALFORMED_CALLS)))
def test_malformed_variants_are_invalid(variant, world):
    turn = _env(world[1]).parse(agents._malformed_call(variant, "Zorvak Pellin"))
    assert turn.kind == "invalid" and "invalid tool call" in turn.error


def test_malformed_calls_are_penalised_then_retried(world):
    records, index = world
    env = _env(index, max_turns=8)
    transcripts = run_episodes(env, NoisyExpertAgent(dataclasses.replace(CLEAN, malformed=1.0)), records)
    for record, t in zip(records, transcripts):
        assert t.metrics["em"] == 1.0 and t.metrics["format_ok"] == 0.0
        assert t.metrics["n_bad_calls"] == t.metrics["n_calls"] == record.hops
        assert t.process_rewards == pytest.approx([-0.1, 0.2] * record.hops + [0.0])
        assert t.outcome_reward == pytest.approx(1.0 + 0.1 - 0.1 * record.hops)
        assert t.observations[0].startswith("Error: invalid tool call")


def test_too_few_turns_ends_without_answer(world):
    records, index = world
    three = [r for r in records if r.hops == 3]
    for t in run_episodes(_env(index, max_turns=2), OracleAgent(), three):
        assert t.metrics["answered"] == 0.0 and t.outcome_reward == 0.0 and t.metrics["turns"] == 2.0
        assert len(t.observations) == 1  # the last turn gets no observation
