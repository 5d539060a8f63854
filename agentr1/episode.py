"""The one episode type: what the rollout engine records, the rollout store writes and reads
back, the renderer and traces show, PPO learns from, and the warm-up imitates."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trajectory:
    """One episode as token ids, with where each reward lands.

    ``token_ids[:prompt_len]`` is the prompt; ``action_mask[j] == 1`` iff token ``j`` was sampled
    by the policy. ``turn_ends[k]`` is the index of the last token of assistant turn ``k``; its
    process reward lands there. The outcome lands on the last action token.

    A scripted demonstration (``agentr1.env.episodes.run_episodes``) is the same type: its text
    fields come from play, its ids, mask and turn ends from the trainer's
    ``encode_demonstrations``, and
    its ``rollout_logprobs`` stay empty (nothing was sampled).
    """

    record_id: str
    token_ids: list[int]
    action_mask: list[int]
    rollout_logprobs: list[float]
    prompt_len: int
    turn_ends: list[int] = field(default_factory=list)
    process_rewards: list[float] = field(default_factory=list)
    outcome_reward: float = 0.0
    finish: str = ""
    """``answer``, ``max_turns``, ``context``: why the episode ended."""
    metrics: dict[str, float] = field(default_factory=dict)
    turn_texts: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    group: int = 0
    turn_seconds: list[float] = field(default_factory=list)
    """Wall time of sampling each turn (the batch's, shared by its episodes; for traces)."""
    tool_seconds: list[float] = field(default_factory=list)
    """Wall time of the environment's step after each turn (its tool calls, batched)."""

    @property
    def last_action_index(self) -> int:
        return self.turn_ends[-1] if self.turn_ends else -1

    @property
    def n_action_tokens(self) -> int:
        return sum(self.action_mask)

