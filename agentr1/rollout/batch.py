"""Trajectories -> padded training tensors.

Notation: B episodes, L = longest sequence. Token-aligned tensors have ``T = L - 1`` columns:
column ``j - 1`` describes token ``j`` (its log-prob comes from the logits at position
``j - 1``, its value from the hidden state there). Token 0 is never predicted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from agentr1.episode import Trajectory


@dataclass
class RolloutBatch:
    """A batch of episodes ready for the PPO update.

    input_ids, attention_mask: (B, L). action_mask: (B, T) 1 where the policy sampled the token.
    response_mask: (B, T) 1 for every token after the prompt (action and environment tokens):
    what the losses average over when the loss mask is switched off. process_rewards,
    outcome_rewards: (B, T) rewards on the tokens where they land. rollout_logprobs: (B, T)
    log-probs reported by the rollout backend (0 off the action mask). group_ids, scores: (B,).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    response_mask: torch.Tensor
    process_rewards: torch.Tensor
    outcome_rewards: torch.Tensor
    rollout_logprobs: torch.Tensor
    group_ids: torch.Tensor
    scores: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> "RolloutBatch":
        return RolloutBatch(**{k: v[idx] for k, v in self.__dict__.items()})

    def to(self, device: torch.device | str) -> "RolloutBatch":
        return RolloutBatch(**{k: v.to(device) for k, v in self.__dict__.items()})


def collate(trajs: list[Trajectory], pad_token_id: int) -> RolloutBatch:
    B, L = len(trajs), max(len(t.token_ids) for t in trajs)
    T = L - 1
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    action = torch.zeros((B, T))
    response = torch.zeros((B, T))
    process = torch.zeros((B, T))
    outcome = torch.zeros((B, T))
    logprobs = torch.zeros((B, T))
    for b, t in enumerate(trajs):
        n = len(t.token_ids)
        input_ids[b, :n] = torch.tensor(t.token_ids)
        attention[b, :n] = 1
        action[b, : n - 1] = torch.tensor(t.action_mask[1:], dtype=torch.float)
        response[b, t.prompt_len - 1 : n - 1] = 1.0
        logprobs[b, : n - 1] = torch.tensor(t.rollout_logprobs[1:], dtype=torch.float)
        for end, r in zip(t.turn_ends, t.process_rewards):
            process[b, end - 1] += r
        if t.turn_ends:
            outcome[b, t.last_action_index - 1] += t.outcome_reward
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention, action_mask=action, response_mask=response,
        process_rewards=process, outcome_rewards=outcome, rollout_logprobs=logprobs,
        group_ids=torch.tensor([t.group for t in trajs], dtype=torch.long),
        scores=torch.tensor([t.outcome_reward + sum(t.process_rewards) for t in trajs]),
    )


def length_bucketed_batches(lengths: list[int], batch_size: int, gen: torch.Generator,
                            bucket: int = 32) -> list[list[int]]:
    """One epoch of batches whose members have similar lengths, in random order.

    Episodes run from ~130 tokens (1 hop) to ~400 (3 hops); padding every batch to its longest
    member wasted about 40% of the warm-up's compute. Shuffle, sort within windows of
    ``bucket`` batches, cut into batches, shuffle the batches.
    """
    order = torch.randperm(len(lengths), generator=gen).tolist()
    window = batch_size * bucket
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
