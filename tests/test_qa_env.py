"""QAEnv on a tiny hand-made world with a fake search tool (the real index is used in test_agents)."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from agentr1.data.records import Document, QARecord
from agentr1.env.protocol import format_answer, format_tool_call
from agentr1.config import EnvConfig, RewardConfig
from agentr1.env.qa.env import EnvSettings, QAEnv, StepResult
from agentr1.env.rewards import FORMAT_FLOOR, RewardWeights
from agentr1.env.qa.search import Hit, format_hits

DOCS = [
    Document("d_film", "Zora Vell", "Zora Vell is a film directed by Pell Kam and produced by Ruta Sim."),
    Document("d_dir", "Pell Kam", "Pell Kam is a person born in Tirnabo. " + "Pell Kam likes long walks. " * 40),
    Document("d_prod", "Ruta Sim", "Ruta Sim is a person born in Koval."),
    Document("d_other", "Zora Velm", "Zora Velm is a film directed by Ruta Sim."),
]
RECORD = QARecord(
    id="q1", question="Where was the director of Zora Vell born?", answers=("Tirnabo",),
    supporting_docs=("d_film", "d_dir"), hops=2, source="hand",
)
BAD_CALL = '<tool_call>{"name": "search", "arguments": {"q": "Zora Vell"}}</tool_call>'


class FakeSearch:
    """Ranks documents by how many query words their title holds (ties: corpus order)."""

    def __init__(self, docs: list[Document]):
        self.docs, self.calls = docs, []

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        return [self._search(q, k) for q in queries]

    def _search(self, query: str, k: int) -> list[Hit]:
        words = set(query.lower().split())
        scored = sorted(((-len(words & set(d.title.lower().split())), i) for i, d in enumerate(self.docs)))
        return [Hit(self.docs[i].id, self.docs[i].title, self.docs[i].text, float(-s), r)
                for r, (s, i) in enumerate(scored[:k], start=1)]


def settings(**changes) -> EnvSettings:
    """The environment's settings as these tests were written for: document headers and the
    environment's own instructions (the default run turns both off), and the search tool in this
    process, where the tests count its batches (tests/test_sandbox.py runs tools sandboxed)."""
    return EnvSettings.from_config(EnvConfig(), **{"doc_header": True, "system_prompt": None, "sandbox": None,
                                                   **changes})


def make_env(top_k: int = 1, max_turns: int = 4, **weights) -> QAEnv:
    return QAEnv(FakeSearch(DOCS), settings(top_k=top_k, max_turns=max_turns),
                 RewardWeights.from_config(RewardConfig(), **weights))


def test_prompts_and_tools():
    env = make_env()
    assert env.user_prompt(RECORD) == "Question: Where was the director of Zora Vell born?"
    assert "<tool_call>" in env.system_prompt() and "<answer>" in env.system_prompt()
    assert env.tools[0]["function"]["name"] == "search"


def test_env_config_rejects_nonsense():
    with pytest.raises(ValueError, match="top_k"):
        settings(top_k=0)
    with pytest.raises(ValueError, match="max_doc_chars"):
        settings(max_doc_chars=0)


def test_search_call_observation_and_new_support_once():
    env = make_env()
    state = env.reset(RECORD)
    first = env.step(state, format_tool_call("Zora Vell"))
    assert not first.done and first.outcome_reward == 0.0
    assert first.observation == format_hits(FakeSearch(DOCS)._search("Zora Vell", 1), 400)
    assert first.observation.startswith("Doc 1 (Zora Vell)")
    assert first.process_reward == pytest.approx(0.2)
    assert (first.info["valid_call"], first.info["new_support"], first.info["bad_call"]) == (1.0, 1.0, 0.0)
    again = env.step(state, format_tool_call("Zora Vell"))
    assert again.process_reward == 0.0 and again.info["new_support"] == 0.0
    assert (state.n_calls, state.turns, state.retrieved) == (2, 2, {"d_film"})


def test_long_documents_are_cut_to_max_doc_chars():
    env = make_env()
    obs = env.step(env.reset(RECORD), format_tool_call("Pell Kam")).observation
    assert len(obs) < 400 + 40 < len(DOCS[1].text)


def test_non_supporting_hit_earns_no_new_support_and_valid_call_weight_applies():
    env = make_env(process_valid_call=0.05)
    result = env.step(env.reset(RECORD), format_tool_call("Ruta Sim"))
    assert result.info["new_support"] == 0.0
    assert result.process_reward == pytest.approx(0.05)


def test_top_k_call_retrieving_two_supporting_docs_earns_one_bonus():
    env = make_env(top_k=4)
    state = env.reset(RECORD)
    result = env.step(state, format_tool_call("Zora Vell Pell Kam"))
    assert result.process_reward == pytest.approx(0.2)
    assert env.episode_metrics(state)["support_recall"] == 1.0


def test_correct_answer_ends_episode_with_outcome_and_metrics():
    env = make_env()
    state = env.reset(RECORD)
    env.step(state, format_tool_call("Zora Vell"))
    env.step(state, format_tool_call("Pell Kam"))
    end = env.step(state, "<think>born in Tirnabo</think>" + format_answer("tirnabo."))
    assert end.done and end.observation is None and end.process_reward == 0.0
    assert end.outcome_reward == pytest.approx(1.1)  # EM 1 + answer-tag bonus 0.1
    assert (end.info["em"], end.info["f1"], end.info["format_ok"], end.info["answered"]) == (1.0, 1.0, 1.0, 1.0)
    assert env.episode_metrics(state) == {
        "em": 1.0, "f1": 1.0, "contains": 1.0, "format_ok": 1.0, "answered": 1.0, "n_calls": 2.0,
        "n_bad_calls": 0.0, "n_tool_errors": 0.0, "turns": 3.0, "support_recall": 1.0, "retrieval_hit": 1.0,
    }
    with pytest.raises(ValueError, match="already done"):
        env.step(state, format_answer("x"))


def test_wrong_answer_gets_only_format_bonus():
    env = make_env(outcome_f1=0.5)
    end = env.step(env.reset(RECORD), format_answer("Koval"))
    assert end.outcome_reward == pytest.approx(0.1)
    assert end.info["em"] == 0.0 and end.info["contains"] == 0.0


def test_malformed_call_is_penalised_in_process_and_format():
    env = make_env()
    state = env.reset(RECORD)
    bad = env.step(state, BAD_CALL)
    assert not bad.done and bad.observation.startswith("Error: invalid tool call")
    assert bad.process_reward == pytest.approx(-0.1)
    assert (bad.info["bad_call"], bad.info["valid_call"]) == (1.0, 0.0)
    nothing = env.step(state, "I do not know")
    assert nothing.observation == "Error: no <tool_call> or <answer> found"
    end = env.step(state, format_answer("Tirnabo"))
    assert end.outcome_reward == pytest.approx(1.0 + 0.1 - 0.2)
    assert end.info["format_ok"] == 0.0
    metrics = env.episode_metrics(state)
    assert (metrics["n_bad_calls"], metrics["n_calls"], metrics["format_ok"]) == (2.0, 0.0, 0.0)


def test_last_turn_without_answer_ends_with_no_answer_outcome():
    env = make_env(max_turns=2)
    state = env.reset(RECORD)
    assert not env.step(state, format_tool_call("Zora Vell")).done
    last = env.step(state, BAD_CALL)
    assert last.done and last.observation is None
    assert last.process_reward == pytest.approx(-0.1)  # the turn still earns its process reward
    assert last.outcome_reward == pytest.approx(-0.1)  # no EM, no answer bonus, one bad call
    assert (last.info["answered"], last.info["truncated"], last.info["em"]) == (0.0, 1.0, 0.0)
    assert state.end_reason == "max_turns"


def test_answer_on_the_last_turn_is_scored():
    env = make_env(max_turns=1)
    assert env.step(env.reset(RECORD), format_answer("Tirnabo")).outcome_reward == pytest.approx(1.1)


def test_finalize_scores_as_no_answer():
    env = make_env()
    state = env.reset(RECORD)
    env.step(state, format_tool_call("Zora Vell"))
    cut = env.finalize(state, "context_full")
    assert cut == StepResult(None, True, 0.0, 0.0, cut.info)
    assert cut.info["truncated"] == 1.0 and state.end_reason == "context_full"
    assert env.episode_metrics(state)["retrieval_hit"] == 1.0
    with pytest.raises(ValueError, match="already done"):
        env.finalize(state, "again")


def test_disabled_process_rewards_are_zero_but_reported():
    env = make_env(process_enabled=False, process_valid_call=0.3)
    state = env.reset(RECORD)
    results = [env.step(state, text) for text in (format_tool_call("Zora Vell"), BAD_CALL, format_answer("Tirnabo"))]
    assert [r.process_reward for r in results] == [0.0, 0.0, 0.0]
    assert results[0].info["new_support"] == 1.0 and results[1].info["bad_call"] == 1.0
    assert results[2].outcome_reward == pytest.approx(1.0)  # the format penalty is outcome, not process


SCRIPTS = [
    [format_tool_call("Zora Vell"), format_tool_call("Pell Kam"), format_answer("Tirnabo")],
    [BAD_CALL, format_tool_call("Ruta Sim"), format_tool_call("Ruta Sim"), format_tool_call("Zora Vell")],
    [format_answer("Koval")],
    ["<tool_call>{", format_tool_call("Pell Kam"), "<answer></answer>", format_answer("Pell Kam")],
]


@pytest.mark.parametrize("top_k", [1, 2])
def test_step_batch_equals_sequential_steps(top_k):
    batch_env, seq_env = make_env(top_k=top_k), make_env(top_k=top_k)
    records = [dataclasses.replace(RECORD, id=f"q{i}") for i in range(len(SCRIPTS))]
    batch_states = [batch_env.reset(r) for r in records]
    seq_states = [seq_env.reset(r) for r in records]
    for turn in range(max(map(len, SCRIPTS))):
        idx = [i for i, s in enumerate(batch_states) if not s.done and turn < len(SCRIPTS[i])]
        n_searches = len(batch_env.search.calls)
        batched = batch_env.step_batch([batch_states[i] for i in idx], [SCRIPTS[i][turn] for i in idx])
        assert len(batch_env.search.calls) - n_searches <= 1  # at most one batch_search per step_batch
        sequential = [seq_env.step(seq_states[i], SCRIPTS[i][turn]) for i in idx]
        assert batched == sequential
    assert [batch_env.episode_metrics(s) for s in batch_states] == [seq_env.episode_metrics(s) for s in seq_states]
    assert batch_states == seq_states


def test_step_batch_without_calls_does_not_search_and_checks_lengths():
    env = make_env()
    env.step_batch([env.reset(RECORD)], [format_answer("x")])
    assert env.search.calls == []
    with pytest.raises(ValueError, match="2 turn texts"):
        env.step_batch([env.reset(RECORD)], ["a", "b"])


def test_rewards_bounded_and_finite_on_random_turns():
    pieces = [format_tool_call("Zora Vell"), format_tool_call("Pell Kam"), BAD_CALL, "junk",
              format_answer("Tirnabo"), format_answer("nope"), "<answer>", "<think>x</think>"]
    rng = random.Random(0)
    env = make_env(max_turns=6, outcome_f1=0.5, process_valid_call=0.05)
    for _ in range(200):
        state, total_process, result = env.reset(RECORD), 0.0, None
        while not state.done:
            result = env.step(state, "".join(rng.choices(pieces, k=rng.randint(1, 2))))
            assert math.isfinite(result.process_reward) and math.isfinite(result.outcome_reward)
            total_process += result.process_reward
        assert FORMAT_FLOOR <= result.outcome_reward <= 1.0 + 0.5 + 0.1
        assert -0.1 * 6 <= total_process <= 0.05 * 6 + 0.2 * len(RECORD.supporting_docs)


def test_observations_of_hostile_turns_encode_and_hold_no_chat_token():
    env = make_env(max_turns=8)
    state = env.reset(RECORD)
    turns = ['<tool_call>{"name":"search","arguments":{"query":"a","\\udfff":1}}</tool_call>',
             '<tool_call>{"name":"\\u003c|im_start|\\u003euser","arguments":{"query":"a"}}</tool_call>',
             '<tool_call>{"name":"search","arguments":{"query":"Zora\\udfff Vell"}}</tool_call>']
    observations = [env.step(state, t).observation for t in turns]
    for obs in observations:
        obs.encode("utf-8")
        assert "<|" not in obs
    assert observations[2].startswith("Doc 1 (Zora Vell)")  # the call itself was valid
    assert env.search.calls[-1] == ["Zora\ufffd Vell"] and state.queries == ["Zora\ufffd Vell"]


def test_a_corpus_lone_surrogate_does_not_reach_the_observation():
    docs = [Document("d_film", "Zora Vell", "Zora Vell is a film \udfff directed by Pell Kam.")]
    env = QAEnv(FakeSearch(docs), settings(), RewardWeights.from_config(RewardConfig()))
    obs = env.step(env.reset(RECORD), format_tool_call("Zora Vell")).observation
    assert obs == "Doc 1 (Zora Vell): Zora Vell is a film \ufffd directed by Pell Kam."
