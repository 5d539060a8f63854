"""The PPO run's steering in closed form: learning-rate warm-up, adaptive KL, dev score, early stops."""
from __future__ import annotations

import math

import pytest

from agentr1.config import PPOConfig
from agentr1.rl.control import adapt_kl_coef, dev_score, lr_warmup_factor, stop_reason


def test_the_learning_rate_rises_linearly_over_the_warm_up_then_holds():
    assert [lr_warmup_factor(i, 4) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_warmup_factor(i, 0) for i in range(3)] == [1.0, 1.0, 1.0]


def test_the_adaptive_kl_coefficient_moves_by_the_clipped_proportional_error():
    assert adapt_kl_coef(0.1, 0.011, 0.01, 10) == pytest.approx(0.1 * (1 + 0.1 / 10))  # 10% above target
    assert adapt_kl_coef(0.1, 0.05, 0.01, 10) == pytest.approx(0.1 * 1.02)  # far above: clipped at +0.2
    assert adapt_kl_coef(0.1, 0.0, 0.01, 10) == pytest.approx(0.1 * 0.98)  # far below: clipped at -0.2
    assert adapt_kl_coef(0.1, 0.01, 0.01, 10) == pytest.approx(0.1)
    assert adapt_kl_coef(0.1, math.nan, 0.01, 10) == 0.1


def test_the_dev_score_is_greedy_sampled_or_their_mean():
    m = {"greedy/em": 0.8, "sampled/em": 0.6}
    assert dev_score(m, "em") == pytest.approx(0.7)
    assert dev_score(m, "greedy/em") == 0.8 and dev_score(m, "sampled/em") == 0.6


def it(kl=0.01, bad=0.1, dev=None):
    return {"actor/ref_kl": kl, "rollout/n_bad_calls": bad, **({"dev/score": dev} if dev is not None else {})}


def test_a_run_stops_when_kl_or_bad_calls_run_away_and_only_then():
    ppo = PPOConfig(stop_kl=0.3, stop_bad_calls=0.25)
    assert stop_reason([], ppo) is None
    assert stop_reason([it(), it(kl=0.29, bad=0.34)], ppo) is None
    assert "ppo.stop_kl 0.3" in stop_reason([it(), it(kl=0.31)], ppo)
    assert "ppo.stop_kl" in stop_reason([it(kl=math.nan)], ppo)  # a NaN KL is not below the bound
    assert "rose by 0.300" in stop_reason([it(bad=0.1), it(bad=0.4)], ppo)
    assert stop_reason([it(kl=5.0, bad=9.0)], PPOConfig()) is None  # no bounds set: never


def test_dev_patience_counts_evaluations_without_a_better_score_from_the_warm_ups():
    ppo = PPOConfig(dev_every=1, dev_patience=2)
    assert stop_reason([it(dev=0.5), it(dev=0.5)], ppo, start_score=0.6) is not None  # never beat the warm-up
    assert stop_reason([it(dev=0.7), it(dev=0.6)], ppo, start_score=0.6) is None
    assert stop_reason([it(dev=0.7), it(), it(dev=0.6), it(dev=0.7)], ppo, start_score=0.6) is not None
    assert stop_reason([it(dev=0.7), it(dev=0.6), it(dev=0.8)], ppo, start_score=0.6) is None


def test_the_steering_options_are_checked_together():
    with pytest.raises(ValueError, match="dev_patience"):
        PPOConfig(dev_patience=2, dev_every=0)
    with pytest.raises(ValueError, match="kl_target"):
        PPOConfig(kl_target=0.01, kl_coef=0.0)
