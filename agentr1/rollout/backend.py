"""The rollout backend interface and its transformers (``hf``) implementation.

A backend does one thing: given a batch of prompts as token ids, sample a continuation for each
until a stop token or a token limit, and return the sampled ids with their log-probabilities.
Multi-turn logic (environment steps, masks, rewards) lives in :mod:`agentr1.rollout.engine`, so a
vLLM backend only has to implement :meth:`RolloutBackend.generate` and
:meth:`RolloutBackend.sync_weights`.

Sampling is seeded per request: row ``i`` draws its noise from its own generator seeded with
``seeds[i]``, so a request's sample does not depend on which other requests share its batch
(the way vLLM's per-request ``seed`` behaves).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one turn. ``temperature == 0`` means greedy."""

    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class Generation:
    """One request's output: sampled ids (stop token included) and their log-probs.

    ``logprobs[i]`` is ``log p(token_ids[i])`` under the temperature-scaled distribution before
    top-p filtering (what the trainer recomputes, so the two can be compared).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


class RolloutBackend(Protocol):
    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]
    ) -> list[Generation]: ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make later samples come from ``model``'s current weights."""


def sample_next(
    logits: torch.Tensor, spec: SamplingSpec, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from ``logits`` (B, V); returns (ids (B,), logprobs (B,)).

    Gumbel-max over the (top-p filtered) temperature-scaled logits, with each row's noise from
    its own generator.
    """
    logits = logits.float()
    if spec.temperature == 0:
        ids = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
        return ids, logp
    scaled = logits / spec.temperature
    logp_all = torch.log_softmax(scaled, dim=-1)
    filtered = _top_p_filter(scaled, spec.top_p) if spec.top_p < 1.0 else scaled
    noise = torch.stack(
        [torch.rand(logits.shape[-1], generator=g).clamp_(min=1e-20) for g in generators]
    )
    ids = (filtered - torch.log(-torch.log(noise))).argmax(dim=-1)
    return ids, logp_all.gather(-1, ids[:, None]).squeeze(-1)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = F.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop_sorted = (cum - F.softmax(sorted_logits, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


class HFBackend:
    """Batched, KV-cached sampling with a transformers causal LM (CPU or GPU).

    Each call left-pads the prompts, prefills them in one forward pass, then decodes one token
    per step for every unfinished row, reusing the KV cache.
    """

    def __init__(self, model: torch.nn.Module, pad_token_id: int, device: str | torch.device = "cpu"):
        self.model = model
        self.pad_token_id = pad_token_id
        self.device = torch.device(device)

    def sync_weights(self, model: torch.nn.Module) -> None:
        # The backend holds the trainer's own module: updates are visible at once.
        self.model = model

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]
    ) -> list[Generation]:
        if not prompts:
            return []
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(prompts, spec, seeds)
        finally:
            self.model.train(was_training)

    def _generate(
        self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]
    ) -> list[Generation]:
        B = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((B, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((B, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        stop = torch.tensor(spec.stop_token_ids, dtype=torch.long, device=self.device)

        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        stopped = torch.zeros(B, dtype=torch.bool, device=self.device)
        past = None
        step_ids, step_pos = input_ids, position_ids
        for _ in range(spec.max_new_tokens):
            out = self.model(
                input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                past_key_values=past, use_cache=True, logits_to_keep=1,
            )
            past = out.past_key_values
            ids, logp = sample_next(out.logits[:, -1, :], spec, generators)
            ids = torch.where(finished, torch.full_like(ids, self.pad_token_id), ids)
            for i in (~finished).nonzero().flatten().tolist():
                out_ids[i].append(int(ids[i]))
                out_lp[i].append(float(logp[i]))
            hit_stop = torch.isin(ids, stop) & ~finished
            stopped |= hit_stop
            finished |= hit_stop
            if bool(finished.all()):
                break
            step_ids = ids[:, None]
            step_pos = step_pos[:, -1:] + 1
            # Finished rows keep decoding pad tokens whose outputs are dropped; their mask is moot.
            attn = torch.cat([attn, attn.new_ones(B, 1)], dim=1)
        return [
            Generation(out_ids[i], out_lp[i], "stop" if bool(stopped[i]) else "length")
            for i in range(B)
        ]
