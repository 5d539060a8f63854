"""Warm-up pieces: packing corpus documents, padding episodes, the action-only loss."""
from __future__ import annotations

import pytest
import torch

from agentr1.episode import Trajectory
from agentr1.rl.sft import demo_returns, fit_value_head, pack_documents, pad_episodes


def test_pack_documents_joins_with_separator_and_drops_the_tail():
    rows = pack_documents([[1, 2, 3], [4], [5, 6]], block=4, sep_id=0)
    assert rows.tolist() == [[1, 2, 3, 0], [4, 0, 5, 6]]  # the last separator does not fill a row
    with pytest.raises(ValueError, match="one row of 10"):
        pack_documents([[1, 2]], block=10, sep_id=0)


def test_pad_episodes_targets_are_the_action_tokens_shifted():
    ids, attn, target = pad_episodes([([5, 6, 7, 8], [0, 0, 1, 1]), ([5, 9], [0, 1])], pad_token_id=99)
    assert ids.tolist() == [[5, 6, 7, 8], [5, 9, 99, 99]]
    assert attn.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # target[b, j] says whether token j + 1 is an action token (predicted at position j)
    assert target.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert target.dtype == torch.float32


def test_demo_returns_sum_the_rewards_still_to_come():
    #           prompt   turn 1   obs   turn 2  obs turn 3
    mask = [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    demo = Trajectory("r", list(range(10)), mask, [], prompt_len=2, turn_ends=[3, 6, 9],
                      process_rewards=[0.2, 0.0, -0.1], outcome_reward=1.0)
    short = Trajectory("s", [1, 2, 3], [0, 1, 1], [], prompt_len=1, turn_ends=[2], process_rewards=[0.5],
                       outcome_reward=-1.0)
    _, _, target = pad_episodes([(d.token_ids, d.action_mask) for d in (demo, short)], pad_token_id=0)
    returns = demo_returns(target, [demo, short])
    assert returns[0].tolist() == pytest.approx([0, 1.1, 1.1, 0, 0, 0.9, 0, 0.9, 0.9])  # mask[1:]
    assert returns[1].tolist() == pytest.approx([-0.5, -0.5, 0, 0, 0, 0, 0, 0, 0])  # padding gets 0
    demo.process_rewards = [0.2, 0.0]  # a reward missing for a turn is refused, not spread
    with pytest.raises(ValueError, match="2 values but 3 positions"):
        demo_returns(target, [demo, short])


def test_fit_value_head_recovers_a_linear_target_and_leaves_the_trunk():
    from models.policy import ActorCritic
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2))
    model = ActorCritic(lm).eval()
    trunk = {k: v.clone() for k, v in model.policy.state_dict().items()}
    ids = torch.randint(0, 50, (8, 12))
    attn, target = torch.ones_like(ids), torch.ones(8, 11)
    truth = torch.nn.Linear(16, 1)
    with torch.no_grad():
        returns = truth(model.hidden_states(ids, attn)[:, :-1]).squeeze(-1)
    r2 = fit_value_head(model, [(ids, attn, target, returns)], ridge=0.0)
    assert r2 > 0.999
    with torch.no_grad():
        _, values = model(ids, attn)
    assert torch.allclose(values[:, :-1], returns, atol=1e-3)
    assert all(torch.equal(v, trunk[k]) for k, v in model.policy.state_dict().items())
