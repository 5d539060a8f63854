"""Tests of agentr1.rl.core: hand-computed cases, a reference loop, junk invariance, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from agentr1.rl import (
    EPS,
    anchor_states,
    compute_gae,
    compute_step_gae,
    entropy_from_logits,
    explained_variance,
    gigpo_advantages,
    grpo_advantages,
    kl_penalty,
    last_index,
    loss_mean,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    place_at,
    place_outcome,
    policy_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    turn_ids,
    value_loss,
)

JUNK = (1e30, -1e30, math.nan, math.inf, -math.inf)
GAMMA_LAM = [(1.0, 1.0), (0.9, 0.8), (0.99, 0.95), (1.0, 0.0), (0.5, 1.0)]


def t(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(a, b, tol=1e-5) -> bool:
    as32 = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    return torch.allclose(as32(a), as32(b), atol=tol)


def with_junk(x: torch.Tensor, mask: torch.Tensor, junk: float) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.full_like(x, junk))


def random_agent_mask(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """Action masks shaped like multi-turn rollouts: action spans, env spans, right padding."""
    mask = torch.zeros(batch, length)
    for b in range(batch):
        pos = 0
        end = int(torch.randint(0, length + 1, (1,), generator=gen))  # padding after `end`
        while pos < end:
            span = int(torch.randint(1, 5, (1,), generator=gen))
            is_action = bool(torch.rand(1, generator=gen) < 0.6)
            mask[b, pos : min(pos + span, end)] = float(is_action)
            pos += span
    return mask


# --------------------------------------------------------------------------- masked statistics


def test_masked_mean_sum_hand_values():
    x = t([1.0, 2.0], [3.0, math.nan])
    mask = t([1, 1], [1, 0])
    assert masked_sum(x, mask).item() == 6.0
    assert masked_mean(x, mask).item() == 2.0
    assert close(masked_mean(x, mask, dim=1), [1.5, 3.0])
    assert close(masked_mean(x, mask, dim=0), [2.0, 2.0])
    assert close(masked_mean(x, t([1, 1], [0, 0]), dim=1), [1.5, 0.0])  # empty row -> 0, not nan


def test_loss_mean_by_token_or_by_trajectory():
    x = t([1.0, 1.0, 1.0, 0.0], [4.0, 9.0, 9.0, 9.0], [5.0, 5.0, 5.0, 5.0])
    mask = t([1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0])  # the last row counts for nothing
    assert close(loss_mean(x, mask), 7.0 / 4.0)  # the long row weighs 3 tokens' worth
    assert close(loss_mean(x, mask, per_trajectory=True), (1.0 + 4.0) / 2.0)
    assert loss_mean(x, torch.zeros(3, 4), per_trajectory=True).item() == 0.0
    # Through the policy loss: ratio 1, so each token's loss is -A.
    adv = t([1.0, 1.0, 1.0, 0.0], [-2.0, 0.0, 0.0, 0.0], [0.0] * 4)
    zeros = torch.zeros(3, 4)
    assert close(policy_loss(zeros, zeros, adv, mask)[0], (-3.0 + 2.0) / 4.0)
    assert close(policy_loss(zeros, zeros, adv, mask, per_trajectory=True)[0], (-1.0 + 2.0) / 2.0)


def test_masked_var_and_whiten_hand_values():
    x = t([1.0, 3.0, 5.0, math.inf])
    mask = t([1, 1, 1, 0])
    assert close(masked_var(x, mask), 4.0)
    assert close(masked_var(x, mask, unbiased=False), 8.0 / 3.0)
    assert close(masked_whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]])
    assert close(masked_whiten(x, mask, shift_mean=False), [[2.0, 3.0, 4.0, 0.0]])  # mean 3 kept
    assert masked_var(x, t([0, 1, 0, 0])).item() == 0.0  # one element: no spread


def test_masked_mean_empty_is_zero_with_zero_grad():
    x = torch.randn(3, 4, requires_grad=True)
    out = masked_mean(x, torch.zeros(3, 4))
    out.backward()
    assert out.item() == 0.0
    assert torch.count_nonzero(x.grad) == 0


# --------------------------------------------------------------------------- logits


def test_logprobs_and_entropy_match_torch():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=gen) * 30  # large logits: stability
    labels = torch.randint(0, 7, (2, 5), generator=gen)
    expected = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert close(logprobs_from_logits(logits, labels), expected, 1e-4)
    dist = torch.distributions.Categorical(logits=logits)
    assert close(entropy_from_logits(logits), dist.entropy(), 1e-4)
    assert close(entropy_from_logits(torch.zeros(1, 1, 8)), [[math.log(8)]])
    assert logprobs_from_logits(logits.bfloat16(), labels).dtype == torch.float32


# --------------------------------------------------------------------------- placement


def test_last_index():
    mask = t([0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0])
    assert last_index(mask).tolist() == [2, -1, 0]


def test_place_outcome_and_place_at():
    action_mask = t([1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1])
    out = place_outcome(torch.tensor([0.5, 7.0, -1.0]), action_mask)
    assert close(out, t([0, 0, 0, 0.5, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, -1.0]))
    summed = place_at([[0.2, -0.1, 0.3], []], [[1, 1, 3], []], (2, 4))
    assert close(summed, t([0, 0.1, 0, 0.3], [0, 0, 0, 0]))
    with pytest.raises(ValueError, match="row 0: position 4"):
        place_at([[1.0]], [[4]], (1, 4))
    with pytest.raises(ValueError, match="row 0: 2 values but 1 positions"):
        place_at([[1.0, 2.0]], [[0]], (1, 4))


# --------------------------------------------------------------------------- GAE


def test_gae_hand_computed_with_gap():
    rewards = t([0.0, 5.0, 0.0, 1.0])  # the 5.0 sits on an env token: ignored
    values = t([0.5, 9.0, 0.2, 0.4])
    mask = t([1, 0, 1, 1])
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert close(adv, [[0.5, 0.0, 0.8, 0.6]])
    assert close(ret, [[1.0, 0.0, 1.0, 1.0]])
    # gamma=0.9, lam=0.8 by hand:
    # t=3: d=1-0.4=0.6, A=0.6 ; t=2: d=0.9*0.4-0.2=0.16, A=0.16+0.72*0.6=0.592
    # t=0 (t=1 skipped): d=0.9*0.2-0.5=-0.32, A=-0.32+0.72*0.592=0.10624
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert close(adv, [[0.10624, 0.0, 0.592, 0.6]])
    assert close(ret, [[0.60624, 0.0, 0.792, 1.0]])


def test_gae_plain_when_mask_is_all_ones():
    # With every token counted it is textbook GAE; T=2, gamma=0.5, lam=0.5 by hand:
    # t=1: d=1-0.2=0.8 ; t=0: d=0+0.5*0.2-0.1=0.0, A=0+0.25*0.8=0.2
    adv, _ = compute_gae(t([0.0, 1.0]), t([0.1, 0.2]), t([1, 1]), gamma=0.5, lam=0.5)
    assert close(adv, [[0.2, 0.8]])


def reference_gae(rewards, values, mask, gamma, lam):
    """Plain per-row loop over the list of masked-in indices."""
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        idx = [i for i in range(rewards.shape[1]) if mask[b, i] != 0]
        next_v, next_a = 0.0, 0.0
        for i in reversed(idx):
            delta = float(rewards[b, i]) + gamma * next_v - float(values[b, i])
            next_a = delta + gamma * lam * next_a
            next_v = float(values[b, i])
            adv[b, i] = next_a
    ret = torch.where(mask.bool(), adv + values.double(), torch.zeros_like(adv))
    return adv, ret


def reference_step_gae(rewards, values, mask, gamma, lam):
    """Per row: the list of turns (runs of the mask), then plain GAE over them."""
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    ret = torch.zeros_like(adv)
    for b in range(rewards.shape[0]):
        turns, prev = [], False
        for i in range(rewards.shape[1]):
            if mask[b, i] != 0:
                if not prev:
                    turns.append([])
                turns[-1].append(i)
            prev = mask[b, i] != 0
        next_v, next_a = 0.0, 0.0
        for turn in reversed(turns):
            v = float(values[b, turn[0]])
            next_a = sum(float(rewards[b, i]) for i in turn) + gamma * next_v - v + gamma * lam * next_a
            next_v = v
            adv[b, turn], ret[b, turn] = next_a, next_a + v
    return adv, ret


@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("estimator", ["token", "step"])
def test_gae_matches_reference_loop(gamma, lam, estimator):
    fast, slow = {"token": (compute_gae, reference_gae), "step": (compute_step_gae, reference_step_gae)}[estimator]
    gen = torch.Generator().manual_seed(int(gamma * 100 + lam * 10))
    mask = random_agent_mask(gen, 8, 23)
    rewards = torch.where(mask.bool(), torch.randn(8, 23, generator=gen), torch.zeros(8, 23))
    values = torch.randn(8, 23, generator=gen)
    adv, ret = fast(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = slow(rewards, values, mask, gamma, lam)
    assert close(adv, ref_adv, 1e-4) and close(ret, ref_ret, 1e-4)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_advantage_mask_bridges_env_tokens():
    # turn 1 = tokens 0-1, env = 2-3, turn 2 = 4-5. lam=0: A_t = r_t + gamma V_next - V_t.
    action_mask = t([1, 1, 0, 0, 1, 1])
    values = t([0.0, 0.1, 5.0, 5.0, 0.3, 0.0])
    rewards = torch.zeros(1, 6)
    adv, _ = compute_gae(rewards, values, action_mask, gamma=1.0, lam=0.0)
    assert close(adv[0, 1], 0.3 - 0.1)  # V(first action token of turn 2), not the env token's 5.0
    plain, _ = compute_gae(rewards, values, torch.ones(1, 6), gamma=1.0, lam=0.0)
    assert close(plain[0, 1], 5.0 - 0.1)  # what plain GAE over all tokens would do


def test_truncated_episode_outcome_reaches_first_action_token():
    # Cut at max turns: two tool calls, no answer, the response ends with an env span.
    action_mask = t([1, 1, 1, 0, 0, 1, 1, 0, 0, 0])
    rewards = place_outcome(torch.tensor([0.5]), action_mask)
    assert rewards[0, 6] == 0.5 and rewards.sum() == 0.5
    zero_v = torch.zeros(1, 10)
    adv, _ = compute_gae(rewards, zero_v, action_mask, gamma=1.0, lam=1.0)
    assert close(adv[0, 0], 0.5)
    # Discounting counts action tokens only: index 6 is 4 masked-in steps after index 0.
    adv, _ = compute_gae(rewards, zero_v, action_mask, gamma=0.9, lam=1.0)
    assert close(adv[0, 0], 0.5 * 0.9**4)


# --------------------------------------------------------------------------- step-level GAE


def test_turn_ids_number_the_runs_of_the_mask():
    assert turn_ids(t([1, 1, 0, 1, 0, 0, 1, 1], [0, 1, 1, 0, 0, 0, 0, 0])).tolist() == [
        [0, 0, -1, 1, -1, -1, 2, 2], [-1, 0, 0, -1, -1, -1, -1, -1]]


def test_step_gae_hand_computed():
    # Two turns (tokens 0-1, 4-6) around an env span. Turn rewards: 0.1 + 0.2 = 0.3 (the 9.0 sits
    # on an env token: ignored) and 1.0; values at the turns' first tokens: V0 = 0.5, V1 = 0.4
    # (the 7.0 and 8.0 inside turns are not step values).
    rewards = t([0.1, 0.2, 9.0, 0.0, 0.0, 0.0, 1.0])
    values = t([0.5, 7.0, 3.0, 3.0, 0.4, 8.0, 8.0])
    mask = t([1, 1, 0, 0, 1, 1, 1])
    # gamma=0.9, lam=0.8: A1 = 1.0 - 0.4 = 0.6; A0 = 0.3 + 0.9*0.4 - 0.5 + 0.72*0.6 = 0.592
    adv, ret = compute_step_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert close(adv, [[0.592, 0.592, 0.0, 0.0, 0.6, 0.6, 0.6]])
    assert close(ret, [[1.092, 1.092, 0.0, 0.0, 1.0, 1.0, 1.0]])
    # Without the advantage mask the response is one step: A = 0.3 + 9.0 + 1.0 - 0.5.
    adv, _ = compute_step_gae(rewards, values, torch.ones(1, 7), gamma=0.9, lam=0.8)
    assert close(adv, [[9.8] * 7])


def test_step_gae_whitens_over_turns_not_tokens():
    # Turn advantages 1.0 (one token) and -1.0 (three tokens): over turns the mean is 0, so
    # whitening keeps their signs and sizes equal; over tokens the long turn would pull the mean.
    rewards, values, mask = t([1.0, 0.0, 0.0, 0.0, -1.0]), torch.zeros(1, 5), t([1, 0, 1, 1, 1])
    adv, _ = compute_step_gae(rewards, values, mask, gamma=1.0, lam=0.0, whiten=True)
    scale = 1.0 / math.sqrt(2.0 + EPS)
    assert close(adv, [[scale, 0.0, -scale, -scale, -scale]], 1e-4)


# --------------------------------------------------------------------------- critic-free estimators


def test_anchor_states_are_equal_exactly_when_the_tokens_before_the_turn_are():
    # Tokens: prompt 7 7, turn 0 (tokens 2-3), a tool answer (4-5), turn 1 (token 6); mask
    # position t stands for token t + 1.
    ids = torch.tensor([[7, 7, 1, 1, 9, 9, 3], [7, 7, 1, 1, 9, 9, 4], [7, 7, 2, 1, 9, 9, 3]])
    mask = t([1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 0])
    states = anchor_states(ids, mask)
    assert states[:, 0].unique().numel() == 1  # every turn 0 starts from the prompt
    assert states[0, 1] == states[1, 1] != states[2, 1]  # row 2 wrote another first turn
    assert anchor_states(ids, mask[:, :2]).shape == (3, 1)


def test_gigpo_hand_values():
    # Two episodes of one question, two turns each (tokens 0-1 and 4); both start from the same
    # state, their second turns from different ones. Turn rewards: 0.2 and 1.0 (score 1.2), 0 and 0.
    mask = t([1, 1, 0, 0, 1], [1, 1, 0, 0, 1])
    rewards = t([0.0, 0.2, 0.0, 0.0, 1.0], [0.0] * 5)
    states = torch.tensor([[0, 1], [0, 2]])
    scores, groups = torch.tensor([1.2, 0.0]), torch.tensor([0, 0])
    # Episode: (1.2 - 0.6) / std([1.2, 0]) = +-0.7071. Step, turn 0: the returns from the shared
    # state are 1.2 and 0, so +-0.7071 too; turn 1: alone in its state, 0.
    adv = gigpo_advantages(rewards, mask, scores, groups, states, gamma=1.0)
    e = 0.6 / math.sqrt(0.72 + 0.0)
    assert close(adv, [[2 * e, 2 * e, 0.0, 0.0, e], [-2 * e, -2 * e, 0.0, 0.0, -e]], 1e-4)
    # step_weight 0 is GRPO
    assert close(gigpo_advantages(rewards, mask, scores, groups, states, 1.0, step_weight=0.0),
                 grpo_advantages(scores, groups, mask), 1e-6)
    # gamma counts turns: a third episode from the same first state, rewarded at its first turn;
    # from turn 0 the returns are 0.2 + 0.5 * 1.0, 0 and 0.5.
    mask3, states3 = torch.cat([mask, mask[:1]]), torch.tensor([[0, 1], [0, 2], [0, 3]])
    rewards3 = torch.cat([rewards, t([0.0, 0.5, 0.0, 0.0, 0.0])])
    scores3, groups3 = torch.tensor([1.2, 0.0, 0.5]), torch.tensor([0, 0, 0])
    step = gigpo_advantages(rewards3, mask3, scores3, groups3, states3, 0.5) - grpo_advantages(scores3, groups3, mask3)
    from_first = torch.tensor([0.7, 0.0, 0.5])
    assert close(step[:, 0], (from_first - from_first.mean()) / (from_first.std() + EPS), 1e-4)


def test_gigpo_step_groups_are_formed_inside_each_episode_group():
    """The paper's group in group: two groups that ask the same question share the first state,
    but a turn is compared only with its own group's. Here each group's two episodes end equal,
    so every step advantage is 0 (pooled across groups, the old code gave +-0.707)."""
    mask = t([1, 1, 0, 0, 1], [1, 1, 0, 0, 1], [1, 1, 0, 0, 1], [1, 1, 0, 0, 1])
    rewards = t([0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0], [0.0] * 5, [0.0] * 5)
    states = torch.tensor([[0, 1], [0, 2], [0, 3], [0, 4]])  # one first state for all four
    scores, groups = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])
    adv = gigpo_advantages(rewards, mask, scores, groups, states, gamma=1.0)
    assert close(adv, torch.zeros_like(adv))
    # one group with a winner: only its own turns move
    scores2 = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rewards2 = rewards.clone()
    rewards2[1] = 0.0
    adv = gigpo_advantages(rewards2, mask, scores2, groups, states, gamma=1.0)
    e = 1 / math.sqrt(2)  # (1 - 0.5) / std([1, 0])
    assert close(adv[:, 0], [2 * e, -2 * e, 0.0, 0.0], 1e-4)


def test_gigpo_mean_normalisation_subtracts_the_group_mean_only():
    """F_norm = 1 (verl-agent's default): both levels are (return - group mean), unscaled."""
    mask = t([1, 1, 0, 0, 1], [1, 1, 0, 0, 1])
    rewards = t([0.0, 0.2, 0.0, 0.0, 1.0], [0.0] * 5)
    states = torch.tensor([[0, 1], [0, 2]])
    scores, groups = torch.tensor([1.2, 0.0]), torch.tensor([0, 0])
    adv = gigpo_advantages(rewards, mask, scores, groups, states, gamma=1.0, norm_by_std=False)
    assert close(adv, [[1.2, 1.2, 0.0, 0.0, 0.6], [-1.2, -1.2, 0.0, 0.0, -0.6]], 1e-5)


def test_grpo_hand_values():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.0])
    groups = torch.tensor([7, 7, 3, 3, 9, 4, 4, 4])  # non-contiguous ids on purpose
    mask = torch.ones(8, 2)
    mask[0, 1] = 0
    adv = grpo_advantages(scores, groups, mask)
    s = 1 / math.sqrt(0.5)  # group 7: mean 0.5, unbiased std sqrt(0.5)
    third = 1 / math.sqrt(1 / 3)  # group 4: mean 1/3, unbiased std sqrt(1/3)
    expected = [0.5 * s, -0.5 * s, 0, 0, 0, 2 / 3 * third, -1 / 3 * third, -1 / 3 * third]
    assert close(adv[:, 0], expected, 1e-4)
    assert adv[0, 1] == 0.0 and close(adv[1, 1], -0.5 * s, 1e-4)
    raw = grpo_advantages(scores, groups, mask, norm_by_std=False)
    assert close(raw[:, 0], [0.5, -0.5, 0, 0, 0, 2 / 3, -1 / 3, -1 / 3])


def test_grpo_equal_scores_are_exactly_zero():
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.7])
    adv = grpo_advantages(scores, torch.tensor([0, 0, 0, 1, 1, 1, 1]), torch.ones(7, 3))
    assert torch.count_nonzero(adv) == 0  # rounding noise / tiny std must not become signal


def test_rloo_hand_values():
    scores = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 3.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    adv = rloo_advantages(scores, groups, torch.ones(6, 2))
    assert close(adv[:, 0], [1.0, -0.5, -0.5, -2.0, 2.0, 0.0])


def test_reinforce_pp_return_to_go_then_whitened():
    mask = t([1, 0, 1], [1, 1, 0])
    rewards = t([0.0, 9.0, 1.0], [1.0, 2.0, 0.0])
    # returns-to-go (gamma 0.5): row 0: [0.5, -, 1.0]; row 1: [1+0.5*2, 2] = [2.0, 2.0]
    rtg = torch.tensor([0.5, 1.0, 2.0, 2.0])
    expected = (rtg - rtg.mean()) / rtg.std()
    adv = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    assert close(adv[mask.bool()], expected, 1e-4)
    assert adv[0, 1] == 0 and adv[1, 2] == 0


# --------------------------------------------------------------------------- losses


def test_policy_loss_clipping_hand_values():
    ratios = torch.tensor([[1.5, 0.5, 1.25]])
    logp = torch.log(ratios).requires_grad_()
    old = torch.zeros(1, 3)
    adv = torch.ones(1, 3)
    mask = torch.ones(1, 3)
    loss, m = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # token 0 clipped at 1.2; token 1 unclipped 0.5 (max(-0.5,-0.8)); token 2 clipped at 1.2
    assert close(loss, -(1.2 + 0.5 + 1.2) / 3)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["pg_loss"] == pytest.approx(loss.item())
    assert m["ppo_kl"] == pytest.approx(-torch.log(ratios).mean().item(), abs=1e-6)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0 and logp.grad[0, 1] != 0
    loss_hi, m_hi = policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss_hi, -(1.28 + 0.5 + 1.25) / 3) and m_hi["pg_clipfrac"] == pytest.approx(1 / 3)


def test_policy_loss_dual_clip():
    logp = torch.log(torch.tensor([[5.0, 5.0]]))
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2)
    plain, _ = policy_loss(logp, torch.zeros(1, 2), adv, mask)
    # token 0: max(5, 1.2) = 5 ; token 1: max(-5, -1.2) = -1.2
    assert close(plain, (5.0 - 1.2) / 2)
    dual, _ = policy_loss(logp, torch.zeros(1, 2), adv, mask, dual_clip_c=3.0)
    assert close(dual, (3.0 - 1.2) / 2)  # negative-advantage token capped at -c*A = 3
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(logp, torch.zeros(1, 2), adv, mask, dual_clip_c=1.0)


def test_value_loss_clipping_hand_values():
    values = torch.tensor([[1.0, 0.1]])
    old = torch.zeros(1, 2)
    returns = torch.tensor([[1.0, 1.0]])
    loss, m = value_loss(values, old, returns, torch.ones(1, 2), clip_eps=0.2)
    # token 0: unclipped 0, clipped (0.2-1)^2=0.64 -> 0.64 ; token 1: both 0.81
    assert close(loss, 0.5 * (0.64 + 0.81) / 2)
    assert m["vf_clipfrac"] == pytest.approx(0.5) and m["vf_loss"] == pytest.approx(loss.item())


def test_kl_estimators():
    logp, ref = torch.tensor([[-1.0, 0.0]]), torch.tensor([[-2.0, -50.0]])
    assert close(kl_penalty(logp, ref, "k1"), [[1.0, 10.0]])  # 50 clamped to 10
    assert close(kl_penalty(logp, ref, "k2"), [[0.5, 10.0]])
    assert close(kl_penalty(logp, ref, "k3"), [[math.exp(-1), 10.0]])
    assert close(kl_penalty(logp, ref, "k3", clamp=100.0)[0, 1], math.exp(-20) + 19.0)
    assert kl_penalty(ref, logp, "k3").min() >= 0  # k3 is never negative
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(logp, ref, "k4")


def test_explained_variance():
    returns = t([1.0, 2.0, 3.0, 99.0])
    mask = t([1, 1, 1, 0])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), returns, mask) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(returns, torch.ones(1, 4), mask) == 0.0  # undefined -> 0


# --------------------------------------------------------------------------- junk invariance


def _all_results(rewards, values, logp, old_logp, ref_logp, adv_in, mask):
    adv, ret = compute_gae(rewards, values, mask, 0.95, 0.9)
    step_adv, step_ret = compute_step_gae(rewards, values, mask, 0.95, 0.9, whiten=True)
    pl, pm = policy_loss(logp, old_logp, adv_in, mask, dual_clip_c=3.0)
    vl, vm = value_loss(values, old_logp, ret, mask)
    return {
        "adv": adv,
        "ret": ret,
        "step_adv": step_adv,
        "step_ret": step_ret,
        "whiten": masked_whiten(values, mask),
        "rpp": reinforce_pp_advantages(rewards, mask, 0.9),
        "grpo": grpo_advantages(torch.arange(6.0) % 2, torch.arange(6) // 2, mask),
        "gigpo": gigpo_advantages(rewards, mask, torch.arange(6.0) % 2, torch.arange(6) // 2,
                                  torch.zeros(6, int(turn_ids(mask).max()) + 1, dtype=torch.long), 0.9),
        "pl": pl,
        "vl": vl,
        "kl": masked_mean(kl_penalty(logp, ref_logp, "k3"), mask),
        "kl_per_trajectory": loss_mean(kl_penalty(logp, ref_logp, "k3"), mask, per_trajectory=True),
        "ev": torch.tensor(explained_variance(values, ret, mask)),
        **{k: torch.tensor(v) for k, v in {**pm, **vm}.items()},
    }


@pytest.mark.parametrize("junk", JUNK)
def test_junk_in_masked_slots_changes_nothing(junk):
    gen = torch.Generator().manual_seed(3)
    mask = random_agent_mask(gen, 6, 17)
    mask[0, 0] = 1  # at least one counted token
    tensors = [torch.randn(6, 17, generator=gen) for _ in range(6)]
    clean = _all_results(*tensors, mask)
    dirty = _all_results(*(with_junk(x, mask, junk) for x in tensors), mask)
    for key, value in clean.items():
        assert torch.isfinite(dirty[key]).all(), key
        assert torch.equal(value, dirty[key]), key


@pytest.mark.parametrize("junk", JUNK)
def test_junk_gives_same_finite_gradients(junk):
    gen = torch.Generator().manual_seed(4)
    mask = random_agent_mask(gen, 4, 12)
    mask[0, 0] = 1
    logp, old, adv, values, ret = (torch.randn(4, 12, generator=gen) for _ in range(5))

    def grads(lp, v):
        lp = lp.clone().requires_grad_()
        v = v.clone().requires_grad_()
        (policy_loss(lp, old, adv, mask)[0] + value_loss(v, old, ret, mask)[0]).backward()
        return lp.grad, v.grad

    clean = grads(logp, values)
    dirty = grads(with_junk(logp, mask, junk), with_junk(values, mask, junk))
    for c, d in zip(clean, dirty):
        assert torch.isfinite(d).all() and torch.equal(c, d)
        assert torch.all(d[mask == 0] == 0)


# --------------------------------------------------------------------------- everything masked


def test_all_masked_losses_are_zero_and_adam_step_changes_nothing():
    """The trainer should skip the step anyway: with momentum from earlier steps Adam would move."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    before = [p.detach().clone() for p in layer.parameters()]
    optim = torch.optim.Adam(layer.parameters(), lr=0.1, weight_decay=0.0)
    out = layer(torch.randn(3, 5, 4))
    logp, values = out[..., 0], out[..., 1]
    mask = torch.zeros(3, 5)
    junk = torch.full((3, 5), math.nan)
    pl, pm = policy_loss(logp, junk, junk, mask)
    vl, vm = value_loss(values, junk, junk, mask)
    assert pl.item() == 0.0 and vl.item() == 0.0
    assert all(v == 0.0 for v in {**pm, **vm}.values())
    (pl + vl).backward()
    assert all(torch.count_nonzero(p.grad) == 0 for p in layer.parameters())
    optim.step()
    assert all(torch.equal(b, p) for b, p in zip(before, layer.parameters()))


def test_all_masked_estimators_are_zero():
    mask = torch.zeros(2, 3)
    rewards = torch.ones(2, 3)
    assert torch.count_nonzero(compute_gae(rewards, rewards, mask, 1.0, 1.0)[0]) == 0
    assert all(torch.count_nonzero(x) == 0 for x in compute_step_gae(rewards, rewards, mask, 1.0, 1.0, whiten=True))
    assert torch.count_nonzero(reinforce_pp_advantages(rewards, mask, 1.0)) == 0
    assert torch.count_nonzero(grpo_advantages(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), mask)) == 0
    assert masked_whiten(rewards, mask).abs().sum() == 0 and EPS > 0


def test_shape_mismatch_names_the_tensors():
    with pytest.raises(ValueError, match=r"compute_gae: .*values=\(2, 4\)"):
        compute_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)


def test_clip_eps_high_reaches_the_policy_loss_from_the_config():
    """ppo.clip_eps_high (DAPO's clip-higher) is a config key that the update uses: a ratio of
    1.25 on a positive advantage is clipped at 1.2 by default and not at 1.28."""
    from agentr1.config import load_config
    from agentr1.recipe.ppo import ppo_hyper

    assert ppo_hyper(load_config(None)).clip_eps_high is None
    hp = ppo_hyper(load_config(None, ["ppo.clip_eps_high=0.28"]))
    assert hp.clip_eps_high == 0.28
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(1.25), requires_grad=True)
    adv, mask = torch.ones(1, 1), torch.ones(1, 1)
    symmetric, _ = policy_loss(logp, old, adv, mask, clip_eps=hp.clip_eps, clip_eps_high=None)
    higher, _ = policy_loss(logp, old, adv, mask, clip_eps=hp.clip_eps, clip_eps_high=hp.clip_eps_high)
    assert close(symmetric, torch.tensor(-1.2)) and close(higher, torch.tensor(-1.25))
