"""Multi-turn batched rollouts: the policy talks to the QA environment, turn by turn.

Every active episode generates its next turn in one backend call; the environment then steps
all of them at once (one batched search). The engine records, token by token, what the policy
sampled (``action_mask = 1``) and what the environment or chat template inserted (``0``).
Sampled ids are appended exactly as sampled; text is decoded only to let the environment parse
the turn, never re-encoded.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from agentr1.episode import Trajectory
from agentr1.rollout.backend import Generation, RolloutBackend, SamplingSpec

log = logging.getLogger("agentr1.train")

# Fewer free positions than this and a new turn is not started (the context is full).
MIN_TURN_ROOM = 8
PROGRESS_EVERY_S = 20.0
"""A rollout still playing this long after its last line says where it is (a pretrained model's
batch of 100 episodes takes a minute or more; the default model's, a second)."""


class ChatLike(Protocol):
    stop_token_ids: list[int]

    def prompt_ids(self, system: str, user: str) -> list[int]: ...

    def observation_ids(self, body: str, turn_closed: bool) -> list[int]: ...

    def is_closed(self, turn: list[int]) -> bool: ...

    def strip_markers(self, text: str) -> str: ...


@dataclass(frozen=True)
class RolloutSettings:
    max_turn_tokens: int
    max_context_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


def episode_seed(base_seed: int, episode: int, turn: int) -> int:
    """A distinct, reproducible sampling seed per (rollout, episode, turn)."""
    return (base_seed * 1_000_003 + episode * 7_919 + turn) % (2**63 - 1)


class RolloutEngine:
    """Runs episodes of ``env`` with samples from ``backend``; see the module docstring."""

    def __init__(self, backend: RolloutBackend, chat: ChatLike, tokenizer: Any, env: Any,
                 settings: RolloutSettings):
        self.backend = backend
        self.chat = chat
        self.tokenizer = tokenizer
        self.env = env
        self.settings = settings

    def run(self, records: list, seed: int, groups: list[int] | None = None,
            temperature: float | None = None) -> list[Trajectory]:
        """Play one episode per record; ``groups`` tags episodes of the same question (GRPO)."""
        # A backend may keep state across the turns of one rollout (hf: its KV cache).
        session = getattr(self.backend, "session", None)
        with session() if session else contextlib.nullcontext():
            return self._play(records, seed, groups, temperature)

    def _play(self, records: list, seed: int, groups: list[int] | None,
              temperature: float | None) -> list[Trajectory]:
        s = self.settings
        temp = s.temperature if temperature is None else temperature
        states = [self.env.reset(r) for r in records]
        trajs = []
        for i, r in enumerate(records):
            ids = self.chat.prompt_ids(self.env.system_turn(r), self.env.user_prompt(r))
            trajs.append(Trajectory(r.id, list(ids), [0] * len(ids), [0.0] * len(ids), len(ids),
                                    group=groups[i] if groups else i))
        active = list(range(len(records)))
        turn = 0
        start = last = time.perf_counter()
        while active:
            active = self._finalize_full(active, trajs, states)
            if not active:
                break
            # Each episode samples up to max_turn_tokens or the room its own context has left.
            limits = [min(s.max_turn_tokens, s.max_context_tokens - len(trajs[i].token_ids)) for i in active]
            spec = SamplingSpec(max(limits), tuple(self.chat.stop_token_ids), temp, s.top_p,
                                None if len(set(limits)) == 1 else tuple(limits))
            started = time.perf_counter()
            gens = self.backend.generate([trajs[i].token_ids for i in active], spec,
                                         [episode_seed(seed, i, turn) for i in active])
            sampled = time.perf_counter()
            texts = [self._append_turn(trajs[i], g) for i, g in zip(active, gens)]
            results = self.env.step_batch([states[i] for i in active], texts)
            stepped = time.perf_counter()
            still = []
            for i, g, res in zip(active, gens, results):
                t = trajs[i]
                t.turn_seconds.append(sampled - started)
                t.tool_seconds.append(stepped - sampled)
                t.process_rewards.append(float(res.process_reward))
                if res.done:
                    # How the environment ended it ("answer", "max_turns"; "call" for a function call)
                    self._close(t, states[i], res, getattr(states[i], "end_reason", None)
                                or ("answer" if states[i].answer is not None else "max_turns"))
                    continue
                obs = self.chat.observation_ids(res.observation, turn_closed=self.chat.is_closed(g.token_ids))
                if len(t.token_ids) + len(obs) + MIN_TURN_ROOM > s.max_context_tokens:
                    self._close(t, states[i], self.env.finalize(states[i], "context"), "context")
                    continue
                t.observations.append(res.observation)
                t.token_ids.extend(obs)
                t.action_mask.extend([0] * len(obs))
                t.rollout_logprobs.extend([0.0] * len(obs))
                still.append(i)
            active = still
            turn += 1
            if stepped - last >= PROGRESS_EVERY_S and active:
                last = stepped
                log.info("rollout: %d turn%s played, %d of %d episodes still playing  %.0fs", turn,
                         "" if turn == 1 else "s", len(active), len(records), stepped - start)
        return trajs

    def _finalize_full(self, active: list[int], trajs: list[Trajectory], states: list) -> list[int]:
        keep = []
        for i in active:
            if self.settings.max_context_tokens - len(trajs[i].token_ids) < MIN_TURN_ROOM:
                self._close(trajs[i], states[i], self.env.finalize(states[i], "context"), "context")
            else:
                keep.append(i)
        return keep

    def _append_turn(self, t: Trajectory, g: Generation) -> str:
        if not g.token_ids:  # cannot happen with max_new_tokens >= 1; guard the reward position
            raise RuntimeError(f"backend returned an empty turn for episode {t.record_id}")
        t.token_ids.extend(g.token_ids)
        t.action_mask.extend([1] * len(g.token_ids))
        t.rollout_logprobs.extend(g.logprobs)
        t.turn_ends.append(len(t.token_ids) - 1)
        text = self.chat.strip_markers(self.tokenizer.decode(g.token_ids, skip_special_tokens=False))
        t.turn_texts.append(text)
        return text

    def _close(self, t: Trajectory, state: Any, res: Any, finish: str) -> None:
        t.outcome_reward = float(res.outcome_reward)
        t.finish = finish
        t.metrics = {k: float(v) for k, v in self.env.episode_metrics(state).items()}
        t.metrics["action_tokens"] = float(t.n_action_tokens)
        t.metrics["length"] = float(len(t.token_ids))
