"""Supervised warm-up: next-token loss on action tokens only.

Environment tokens (prompt, tool responses, chat scaffolding) are context, never targets: the
policy should learn to act, not to predict what the search engine returns.
"""
from __future__ import annotations

import torch

from agentr1.rl.core import logprobs_from_logits


def pad_episodes(episodes: list[tuple[list[int], list[int]]], pad_token_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[(ids, action_mask)] -> input_ids (B, L), attention_mask (B, L), target mask (B, L-1)."""
    L = max(len(ids) for ids, _ in episodes)
    B = len(episodes)
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    target = torch.zeros((B, L - 1))
    for b, (ids, mask) in enumerate(episodes):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attn[b, : len(ids)] = 1
        target[b, : len(ids) - 1] = torch.tensor(mask[1:], dtype=torch.float)
    return input_ids, attn, target


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood over action tokens; metrics: loss and token accuracy.

    Logits are computed at the positions that predict an action token only.
    """
    where = target_mask.bool()
    at = torch.zeros_like(input_ids, dtype=torch.bool)
    at[:, :-1] = where  # the logits at position j - 1 predict token j
    logits, _ = model(input_ids=input_ids, attention_mask=attention_mask, logits_at=at)
    logits = logits.float()[None]  # (1, N, V)
    labels = input_ids[:, 1:][where][None]
    nll = -logprobs_from_logits(logits, labels)
    loss = nll.mean() if nll.numel() else nll.sum()
    with torch.no_grad():
        acc = (logits.argmax(-1) == labels).float().mean() if nll.numel() else torch.zeros(())
    return loss, {"sft/loss": float(loss.detach()), "sft/token_acc": float(acc)}
