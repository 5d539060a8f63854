"""A backend wrapper that plays naive RAG: the first turn forced to a search for the question.

Naive RAG is the baseline every tool-using agent is compared against (Agent-R1's table: search
once with the question as the query, then answer from what came back). It is played through the
same engine, environment and evaluation as the agent, so its numbers are comparable: only the
turns differ, and those are forced here, at the backend, where the engine cannot tell them from
sampled ones.
"""
from __future__ import annotations

import dataclasses

from agentr1.rollout.backend import Generation, SamplingSpec


class NaiveRAGBackend:
    """A backend whose first turn of every episode is forced: a search for the question itself.

    Every later turn is forced to open with ``<answer>``; the wrapped backend writes the
    rest. With ``env.max_turns = 2`` an episode is exactly: search the question, answer.
    Forced tokens get log-prob 0 (this backend is for evaluation only, never for training).
    """

    def __init__(self, inner, first_turns: dict[tuple[int, ...], list[int]], answer_prefix: list[int]):
        self.inner = inner
        self.first_turns = first_turns
        """Prompt ids -> ids of the forced tool call (one entry per question)."""
        self.answer_prefix = list(answer_prefix)

    def sync_weights(self, model) -> None:
        self.inner.sync_weights(model)

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[Generation]:
        out: list[Generation | None] = [None] * len(prompts)
        rest = []
        for i, prompt in enumerate(prompts):
            forced = self.first_turns.get(tuple(prompt))
            if forced is None:
                rest.append(i)
            else:
                out[i] = Generation(list(forced), [0.0] * len(forced), "stop")
        if rest:
            n = len(self.answer_prefix)
            limits = spec.limits(len(prompts))
            answer_spec = dataclasses.replace(spec, max_new_tokens=max(1, spec.max_new_tokens - n),
                                              row_limits=tuple(max(1, limits[i] - n) for i in rest))
            gens = self.inner.generate([prompts[i] + self.answer_prefix for i in rest], answer_spec,
                                       [seeds[i] for i in rest])
            for i, g in zip(rest, gens):
                out[i] = Generation(self.answer_prefix + g.token_ids, [0.0] * n + g.logprobs, g.finish_reason)
        return out
