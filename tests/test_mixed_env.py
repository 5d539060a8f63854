"""The mixed environment (agentr1/env/mixed/env.py): search and sql in one episode, an oracle
at EM 1.0, process rewards for a supporting document and for an sql hop's value."""
from __future__ import annotations

from collections import Counter

import pytest

from agentr1.config import Config
from agentr1.env.mixed.synth import generate
from agentr1.data.generated import write_dataset
from agentr1.env.episodes import run_episodes
from agentr1.env.mixed.env import oracle
from agentr1.env.protocol import format_call
from agentr1.env.registry import build_env


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    data = tmp_path_factory.mktemp("mixed") / "data"
    splits, corpus, files = generate(2, n_train=80, n_dev=4, n_test=40)
    write_dataset(data, splits, corpus, files=files)
    return splits, build_env(Config.model_validate({"env": {"kind": "mixed"}, "data": {"dir": str(data)}}), data)


def test_questions_need_both_tools_and_generation_is_deterministic(mixed):
    splits, env = mixed
    assert [t["function"]["name"] for t in env.tools] == ["search", "sql"]
    tools = Counter(frozenset(h["tool"] for h in r.meta["chain"]) for r in splits["train"])
    assert tools[frozenset({"search", "sql"})] > len(splits["train"]) / 2
    again = generate(2, n_train=80, n_dev=4, n_test=40)
    assert again[0] == splits and again[2] == generate(2, n_train=80, n_dev=4, n_test=40)[2]


def test_the_oracle_answers_every_question_with_both_tools(mixed):
    splits, env = mixed
    transcripts = run_episodes(env, oracle(), splits["test"])
    assert all(t.metrics["em"] == 1.0 and t.metrics["support_recall"] == 1.0 for t in transcripts)
    names = {env.parse(turn).name for t in transcripts for turn in t.turn_texts[:-1]}
    assert names == {"search", "sql"}


def test_each_tool_earns_the_process_reward_for_its_gold_item(mixed):
    splits, env = mixed
    record = next(r for r in splits["test"] if [h["tool"] for h in r.meta["chain"]][:2] == ["search", "sql"])
    state = env.reset(record)
    searched = env.step(state, format_call("search", {"query": record.meta["chain"][0]["query"]}))
    queried = env.step(state, format_call("sql", {"query": record.meta["chain"][1]["query"]}))
    assert searched.info["new_support"] == 1.0 and queried.info["new_support"] == 1.0
    demo = run_episodes(env, env.demonstrator(None, 0), splits["train"])
    assert 0.2 < sum(t.metrics["em"] for t in demo) / len(demo) < 0.8  # the expert's systematic mistakes
