"""Answer metrics (SQuAD/HotpotQA) and reward combination."""
from __future__ import annotations

import dataclasses
import math

import pytest

from agentr1.config import RewardConfig
from agentr1.env.rewards import (
    FORMAT_FLOOR,
    AnswerScores,
    RewardWeights,
    contains,
    exact_match,
    f1,
    format_reward,
    normalize_answer,
    outcome_reward,
    process_reward,
    score_answer,
)


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an Apple a day", "apple day"),
        ("Theatre", "theatre"),  # articles only as whole words
        ("  U.S.A. ", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_best_over_golds_and_none():
    assert exact_match("the Kelmora", ["Zorvak", "kelmora."]) == 1.0
    assert exact_match("Kelmora City", ["Kelmora"]) == 0.0
    assert exact_match(None, ["Kelmora"]) == 0.0
    assert exact_match("Kelmora", []) == 0.0


def test_f1_token_overlap_and_hotpot_special_answers():
    # pred tokens {kelmora, city}, gold {kelmora}: P=1/2, R=1 -> F1=2/3
    assert f1("Kelmora City", ["Kelmora"]) == pytest.approx(2 / 3)
    assert f1("Kelmora City", ["Zorvak", "Kelmora City"]) == 1.0
    assert f1("Zorvak", ["Kelmora"]) == 0.0
    assert f1("yes", ["no"]) == 0.0
    assert f1("no answer", ["noanswer"]) == 0.0  # "no answer" normalises to 2 tokens, not the special one
    assert f1("yes it is", ["yes"]) == 0.0  # HotpotQA: gold is special and differs
    assert f1("yes", ["yes"]) == 1.0
    assert f1(None, ["x"]) == 0.0


def test_contains_is_a_token_span():
    assert contains("I think it is the Kelmora City", ["Kelmora City"]) == 1.0
    assert contains("Kelmora Cityscape", ["Kelmora City"]) == 0.0  # not a token span
    assert contains("City Kelmora", ["Kelmora City"]) == 0.0  # order matters
    assert contains("x", ["the"]) == 0.0


def test_a_gold_that_normalises_to_nothing_is_matched_as_written_only():
    """A gold of punctuation or articles alone normalises to "": junk that normalises to "" too
    (an empty answer, "!!!") must not match it (issue 48); the same text does."""
    for score in (exact_match, f1, contains):
        assert score("!!!", ["?"]) == 0.0 and score("", ["the"]) == 0.0 and score(" ? ", ["?"]) == 1.0
        assert score("the", ["the", "Kelmora"]) == 1.0


def test_answers_are_compared_after_nfkc():
    """Full-width letters and digits, ligatures: the same answer as their plain forms."""
    assert exact_match("Ｋｅｌｍｏｒａ １２", ["kelmora 12"]) == 1.0
    assert exact_match("ﬁnal", ["final"]) == 1.0 and f1("ｘ ｙ", ["x y"]) == 1.0


def test_score_answer_bundles_metrics():
    assert score_answer("Kelmora", ["kelmora"]) == AnswerScores(1.0, 1.0, 1.0)
    assert score_answer(None, ["kelmora"]) == AnswerScores(0.0, 0.0, 0.0)


def test_reward_weights_frozen_and_defaults():
    w = RewardWeights.from_config(RewardConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.outcome_em = 2.0  # type: ignore[misc]
    assert (w.outcome_em, w.format_answer, w.process_new_support, w.process_bad_call) == (1.0, 0.1, 0.2, -0.1)


def test_process_reward_components_and_switch():
    w = RewardWeights.from_config(RewardConfig(), process_valid_call=0.05)
    assert process_reward(True, True, False, w) == pytest.approx(0.25)
    assert process_reward(False, False, True, w) == pytest.approx(-0.1)
    assert process_reward(True, True, False, dataclasses.replace(w, process_enabled=False)) == 0.0


def test_outcome_reward_combines_em_f1_and_floored_format():
    w = RewardWeights.from_config(RewardConfig(), outcome_em=1.0, outcome_f1=0.5)
    scores = AnswerScores(em=1.0, f1=1.0, contains=1.0)
    assert outcome_reward(scores, True, 0, w) == pytest.approx(1.6)
    assert outcome_reward(scores, True, 2, w) == pytest.approx(1.4)
    assert outcome_reward(AnswerScores(), False, 0, w) == 0.0
    assert format_reward(False, 1000, w) == FORMAT_FLOOR
    assert math.isfinite(outcome_reward(AnswerScores(), False, 10**9, w))
