"""Supervised warm-up: next-token loss on action tokens only.

Environment tokens (prompt, tool responses, chat scaffolding) are context, never targets: the
policy should learn to act, not to predict what the search engine returns.
"""
from __future__ import annotations

import logging
import time

import torch

from agentr1.episode import Trajectory
from agentr1.rl.core import compute_gae, place_at, place_outcome, token_stats_for

log = logging.getLogger("agentr1.train")


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


def pack_documents(docs: list[list[int]], block: int, sep_id: int) -> torch.Tensor:
    """Token lists joined end to end, each followed by ``sep_id``, cut into rows of ``block``
    tokens (R, block); the tail that does not fill a row is dropped."""
    flat = [t for doc in docs for t in (*doc, sep_id)]
    rows = len(flat) // block
    if rows == 0:
        raise ValueError(f"pack_documents: {len(flat)} tokens do not fill one row of {block}")
    return torch.tensor(flat[: rows * block], dtype=torch.long).view(rows, block)


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood over action tokens; metrics: loss and token accuracy.

    Logits are computed at the positions that predict an action token only.
    """
    where = target_mask.bool()
    at = torch.zeros_like(input_ids, dtype=torch.bool)
    at[:, :-1] = where  # the logits at position j - 1 predict token j
    logits, _ = model(input_ids=input_ids, attention_mask=attention_mask, logits_at=at)
    labels = input_ids[:, 1:][where][None]
    nll = -token_stats_for(model)(logits[None], labels)[0]  # (1, N)
    loss = nll.mean() if nll.numel() else nll.sum()
    with torch.no_grad():
        acc = (logits[None].argmax(-1) == labels).float().mean() if nll.numel() else torch.zeros(())
    return loss, {"sft/loss": float(loss.detach()), "sft/token_acc": float(acc)}


def demo_returns(target_mask: torch.Tensor, demos: list[Trajectory]) -> torch.Tensor:
    """Returns-to-go (gamma 1) of encoded demonstrations padded by ``pad_episodes`` (its target
    mask, (B, L-1)), computed as PPO computes them at ``ppo.gamma`` 1 (every preset's; another
    gamma still fits gamma-1 returns): each turn's process reward on its last action token
    (``turn_ends``), the outcome on the episode's last one, then GAE with V = 0 and lam = 1. A
    token of turn k gets the process rewards of turns k.. plus the outcome; environment tokens
    get 0. Column j - 1 is token j."""
    positions = [[end - 1 for end in t.turn_ends] for t in demos]
    rewards = place_at([t.process_rewards for t in demos], positions, tuple(target_mask.shape), target_mask.device)
    rewards += place_outcome(torch.tensor([t.outcome_reward for t in demos], dtype=torch.float32,
                                          device=target_mask.device), target_mask)
    return compute_gae(rewards, torch.zeros_like(rewards), target_mask, gamma=1.0, lam=1.0)[1]


@torch.no_grad()
def fit_value_head(model, batches, ridge: float = 1e-2) -> float:
    """Least-squares fit of the linear value head to returns-to-go, the trunk untouched.

    ``batches`` yields ``(input_ids, attention_mask, target_mask, returns)`` with the last two
    (B, L-1), aligned like PPO's values (column j - 1 is token j, read from the hidden state
    before it). Sets the head's weight and bias and returns R^2 on those tokens. A critic that
    starts at 0 makes GAE's first advantages plain returns; this starts it at the baseline of
    the demonstrations the policy imitates.
    """
    head = model.value_head
    xtx = torch.zeros(head.in_features + 1, head.in_features + 1, dtype=torch.float64)
    xty = torch.zeros(head.in_features + 1, dtype=torch.float64)
    ys = []
    for input_ids, attention_mask, target, returns in batches:
        hidden = model.hidden_states(input_ids, attention_mask)[:, :-1][target.bool()].double()
        x = torch.cat([hidden, torch.ones(len(hidden), 1, dtype=torch.float64)], dim=1)
        y = returns[target.bool()].double()
        xtx += x.T @ x
        xty += x.T @ y
        ys.append(y)
    y = torch.cat(ys)
    if len(y) == 0:
        raise ValueError("fit_value_head: no action tokens to fit on")
    reg = ridge * len(y) * torch.eye(len(xty), dtype=torch.float64)
    reg[-1, -1] = 0.0  # the bias is not shrunk
    w = torch.linalg.solve(xtx + reg, xty)
    head.weight.copy_(w[:-1].to(head.weight.dtype)[None])
    head.bias.copy_(w[-1:].to(head.bias.dtype))
    # R^2 from the normal equations: sse = y'y - 2 w'X'y + w'X'Xw
    sse = float(y @ y - 2 * w @ xty + w @ xtx @ w)
    sst = float(((y - y.mean()) ** 2).sum())
    return 1.0 - sse / max(sst, 1e-12)


def ids_and_masks(demos: list[Trajectory]) -> list[tuple[list[int], list[int]]]:
    """What :func:`pad_episodes` takes, of encoded demonstrations."""
    return [(t.token_ids, t.action_mask) for t in demos]


def value_fit_batches(demos: list[Trajectory], pad_token_id: int, device, batch_size: int = 64):
    """Padded demonstrations with their returns-to-go, for :func:`fit_value_head` (a progress
    line when 20 s have passed: a pretrained model's forward passes take minutes). Batches of
    similar lengths, shortest first: the fit is a sum over tokens, and fewer pads are run (on
    SmolLM2's 512 demonstrations, 0.78x the positions of the played order)."""
    t0 = last = time.time()
    demos = sorted(demos, key=lambda t: len(t.token_ids))
    for start in range(0, len(demos), batch_size):
        chunk = demos[start:start + batch_size]
        ids, attn, target = pad_episodes(ids_and_masks(chunk), pad_token_id)
        returns = demo_returns(target, chunk)
        yield ids.to(device), attn.to(device), target.to(device), returns.to(device)
        if time.time() - last >= 20:
            last = time.time()
            log.info("warm-up: value fit %d/%d demonstrations  %.0fs", start + len(chunk), len(demos), last - t0)
