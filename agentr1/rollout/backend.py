"""The rollout backend interface and its transformers (``hf``) implementation.

A backend does one thing: given a batch of prompts as token ids, sample a continuation for each
until a stop token or a token limit, and return the sampled ids with their log-probabilities.
Multi-turn logic (environment steps, masks, rewards) lives in :mod:`agentr1.rollout.engine`, so a
vLLM backend only has to implement :meth:`RolloutBackend.generate` and
:meth:`RolloutBackend.sync_weights`. A backend may also offer ``session()``, a context the engine
opens around each rollout, inside which it may keep state from one turn's call to the next
(:class:`HFBackend` keeps its KV cache; vLLM's prefix cache needs no such hint).

Sampling is seeded per request: row ``i`` draws its noise from its own generator seeded with
``seeds[i]``, so a request's sample does not depend on which other requests share its batch
(the way vLLM's per-request ``seed`` behaves).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

NEG_INF = float("-inf")
MIN_SHARED_PREFIX = 32
"""Tokens that every prompt of a first call must share before they are prefilled once for all
rows (a system prompt and tool schemas); shorter common starts are not worth a second pass."""


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one turn. ``temperature == 0`` means greedy."""

    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    temperature: float = 1.0
    top_p: float = 1.0
    row_limits: tuple[int, ...] | None = None
    """Per prompt, its own cap (at most ``max_new_tokens``): the room an episode near the end of
    its context has left, so that it never cuts its batch-mates' turns. None: ``max_new_tokens``
    for every prompt."""

    def limits(self, n: int) -> list[int]:
        """The token cap of each of ``n`` prompts."""
        if self.row_limits is None:
            return [self.max_new_tokens] * n
        if len(self.row_limits) != n:
            raise ValueError(f"got {len(self.row_limits)} row limits for {n} prompts")
        return [min(k, self.max_new_tokens) for k in self.row_limits]


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
    gumbel = None if spec.temperature == 0 else _gumbel(generators, 1, logits.shape[-1])[:, 0]
    return _sample(logits, spec, gumbel)


def _gumbel(generators: list[torch.Generator], steps: int, vocab: int) -> torch.Tensor:
    """(B, steps, V) Gumbel noise, row ``i`` from ``generators[i]`` and on its device: the same
    numbers as ``steps`` successive draws of ``vocab`` (a generator fills a tensor in order)."""
    u = torch.stack([torch.rand(steps, vocab, generator=g, device=g.device) for g in generators]).clamp_(min=1e-20)
    return u.log_().neg_().log_().neg_()


class _GumbelStream:
    """Per-step noise for :func:`_sample`, drawn for up to ``NOISE_BLOCK`` floats of steps at a
    time: one ``torch.rand`` per row per block instead of per step (its per-call cost was most
    of the sampling time with the tiny model's 2k vocabulary)."""

    NOISE_BLOCK = 1 << 22  # floats (16 MB): a whole turn for small vocabularies, bounded for large

    def __init__(self, generators: list[torch.Generator], max_steps: int):
        self.generators, self.left = generators, max_steps
        self.buf, self.i = None, 0

    def next(self, vocab: int) -> torch.Tensor:
        """(B, V) noise for the next step."""
        if self.buf is None or self.i == self.buf.shape[1]:
            block = max(1, min(self.left, self.NOISE_BLOCK // (len(self.generators) * vocab)))
            self.buf, self.i = _gumbel(self.generators, block, vocab), 0
            self.left -= block
        self.i += 1
        return self.buf[:, self.i - 1]


def _sample(logits: torch.Tensor, spec: SamplingSpec, gumbel: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.float()
    if spec.temperature == 0:
        ids = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
        return ids, logp
    scaled = logits / spec.temperature
    logp_all = torch.log_softmax(scaled, dim=-1)
    filtered = _top_p_filter(scaled, spec.top_p) if spec.top_p < 1.0 else scaled
    # The noise comes from per-row generators on the logits' device (HFBackend): the move is a no-op there.
    ids = (filtered + gumbel.to(logits.device, non_blocking=True)).argmax(dim=-1)
    return ids, logp_all.gather(-1, ids[:, None]).squeeze(-1)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = F.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop_sorted = (cum - F.softmax(sorted_logits, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


class _BufferLayer(DynamicLayer):
    """A KV cache layer in buffers allocated once per call (``capacity`` positions): a step is
    written in place, where the stock ``DynamicLayer`` ``torch.cat``-s the whole cache at every
    step (a fifth of the large model's rollout time, profiled). Positions past ``length`` are
    never read, so the buffers need not be initialised. They are laid out (B, capacity, H, D),
    so gathering a row's positions is one ``index_select`` (see ``HFBackend._reuse``); the
    attention reads (B, H, length, D) views."""

    def __init__(self, capacity: int, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                 length: int = 0):
        super().__init__()
        self.capacity, self.buf_k, self.buf_v, self.length = capacity, keys, values, length
        if keys is not None:
            self._views()

    def _views(self) -> None:
        self.dtype, self.device, self.is_initialized = self.buf_k.dtype, self.buf_k.device, True
        self.keys = self.buf_k[:, : self.length].transpose(1, 2)
        self.values = self.buf_v[:, : self.length].transpose(1, 2)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.buf_k is None:
            B, H, _, D = key_states.shape
            self.buf_k = key_states.new_empty(B, self.capacity, H, D)
            self.buf_v = value_states.new_empty(B, self.capacity, value_states.shape[1], value_states.shape[3])
        n = key_states.shape[-2]
        self.buf_k[:, self.length : self.length + n] = key_states.transpose(1, 2)
        self.buf_v[:, self.length : self.length + n] = value_states.transpose(1, 2)
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


@dataclass
class _TurnCache:
    """What one batch's KV cache holds after a call: storage column ``j`` of row ``r`` is a
    token of ``seqs[r]`` iff ``mask[r, j]``; masked columns (padding, tokens decoded after a
    row stopped) are junk never attended to. ``seqs[r]`` is the prompt plus the sampled ids
    that were fed back (the last sampled one usually was not)."""

    layers: list[_BufferLayer]
    mask: torch.Tensor  # (R, W) long
    seqs: list[list[int]]

    def match(self, prompts: list[list[int]]) -> list[int]:
        """Per prompt, a row whose sequence it strictly extends, or -1 (prefill it whole).

        The engine passes the episodes still playing in the order of the last call, so a
        forward scan finds each at once; any other order still matches, by a full scan."""
        rows, j = [], 0
        for p in prompts:
            hit = next((r for r in [*range(j, len(self.seqs)), *range(j)] if _extends(p, self.seqs[r])), -1)
            rows.append(hit)
            j = hit + 1 if hit >= 0 else j
        return rows


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest start all prompts share, at most the shortest prompt's length - 1
    (every row keeps a token of its own to prefill)."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def _extends(prompt: list[int], seq: list[int]) -> bool:
    return len(prompt) > len(seq) and prompt[: len(seq)] == seq


class HFBackend:
    """Batched, KV-cached sampling with a transformers causal LM (CPU or GPU).

    Each call left-pads the prompts, prefills them in one forward pass, then decodes one token
    per step for every unfinished row, reusing the KV cache.

    Inside :meth:`session` (the engine opens one per rollout) the cache also outlives the call:
    a prompt that extends a sequence of the previous call (the same episode, one turn on) is
    prefilled only from where that sequence ends, i.e. its last sampled token, the chat
    template's frame and the observation. Rows no prompt extends (finished episodes) are
    dropped, and the kept rows are compacted to their valid tokens, so between calls the cache
    holds ``rows x longest episode`` positions per layer (the engine keeps episodes within
    ``max_context_tokens``); while a call runs, its new tokens and turn are added on the right. ``reuse_cache=False`` re-prefills every call
    (the path before reuse; kept to check reuse samples the same and to benchmark it).
    """

    def __init__(self, model: torch.nn.Module, pad_token_id: int, device: str | torch.device = "cpu",
                 reuse_cache: bool = True):
        self.model = model
        self.pad_token_id = pad_token_id
        self.device = torch.device(device)
        self.reuse_cache = reuse_cache
        self._in_session = False
        self._kept: _TurnCache | None = None

    def sync_weights(self, model: torch.nn.Module) -> None:
        # The backend holds the trainer's own module: updates are visible at once. A kept cache
        # was computed by the old weights.
        self.model = model
        self._kept = None

    @contextmanager
    def session(self) -> Iterator[None]:
        """Calls inside may reuse each other's KV cache; it is freed on exit. The weights must
        not change inside (a rollout samples from one policy)."""
        self._in_session, self._kept = self.reuse_cache, None
        try:
            yield
        finally:
            self._in_session, self._kept = False, None

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
        kept, self._kept = self._kept, None  # freed before this call allocates its own
        layers, mask, cached = self._reuse(kept, prompts, spec) if kept is not None else self._shared(prompts, spec)
        # The new tokens of each row, left-padded so every row's last column is real.
        suffixes = [p[n:] for p, n in zip(prompts, cached)]
        width = max(len(s) for s in suffixes)
        chunk = torch.full((B, width), self.pad_token_id, dtype=torch.long)
        chunk_mask = torch.zeros((B, width), dtype=torch.long)
        for i, s in enumerate(suffixes):
            chunk[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            chunk_mask[i, width - len(s):] = 1
        chunk, chunk_mask = chunk.to(self.device), chunk_mask.to(self.device)
        # Rope positions count a row's real tokens, wherever they sit in storage.
        start = torch.tensor(cached, dtype=torch.long, device=self.device)[:, None]
        position_ids = (start + chunk_mask.cumsum(-1) - 1).clamp(min=0)
        filled = mask.shape[1] + width
        mask = torch.cat([mask, chunk_mask, mask.new_zeros(B, spec.max_new_tokens)], dim=1)
        room = filled + spec.max_new_tokens
        cache = Cache(layers=layers) if layers else Cache(layer_class_to_replicate=lambda: _BufferLayer(room))
        # Drawn where the logits are: on a GPU a 152k vocabulary at 128 rows is 78 MB of noise a
        # step, which the host would otherwise draw and copy. A seed gives the same samples on the
        # same kind of device (CPU and CUDA generators draw different numbers).
        noise = None if spec.temperature == 0 else _GumbelStream(
            [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds], spec.max_new_tokens)
        stops = set(spec.stop_token_ids)
        limits = spec.limits(B)

        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        live = list(range(B))  # rows still sampling
        fed = [len(p) for p in prompts]  # tokens of prompt + sample whose KV is cached
        step_ids, step_pos = chunk, position_ids
        for step in range(spec.max_new_tokens):
            out = self.model(
                input_ids=step_ids, attention_mask=mask[:, :filled], position_ids=step_pos,
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            logits = out.logits[:, -1, :]
            ids, logp = _sample(logits, spec, noise.next(logits.shape[-1]) if noise else None)
            ids_l, logp_l = ids.tolist(), logp.tolist()
            for i in live:
                out_ids[i].append(ids_l[i])
                out_lp[i].append(logp_l[i])
            fed_now, live = live, [i for i in live if ids_l[i] not in stops and len(out_ids[i]) < limits[i]]
            if not live or step == spec.max_new_tokens - 1:
                break
            # Rows that stopped earlier decode a pad whose KV is masked out; a row that stopped
            # just now feeds its stop token for real (the next turn then need not prefill it).
            feed = torch.full((B,), self.pad_token_id, dtype=torch.long)
            feed[fed_now] = torch.tensor([ids_l[i] for i in fed_now], dtype=torch.long)
            mask[fed_now, filled] = 1
            for i in fed_now:
                fed[i] += 1
            filled += 1
            step_ids = feed.to(self.device)[:, None]
            step_pos = step_pos[:, -1:] + 1
        if self._in_session:
            self._kept = _TurnCache(list(cache.layers), mask[:, :filled],
                                    [(p + o)[:n] for p, o, n in zip(prompts, out_ids, fed)])
        return [
            Generation(out_ids[i], out_lp[i], "stop" if out_ids[i][-1] in stops else "length")
            for i in range(B)
        ]

    def _shared(self, prompts: list[list[int]], spec: SamplingSpec
                ) -> tuple[list[_BufferLayer], torch.Tensor, list[int]]:
        """The cache a call without a kept one starts from: the prompts' common prefix (at least
        ``MIN_SHARED_PREFIX`` tokens, one token short of the shortest prompt) prefilled once, as a
        batch of one, and copied to every row; else nothing. The same (layers, mask, cached) as
        :meth:`_reuse`. A row's prefix KV is then computed the same way whatever its batch-mates."""
        B = len(prompts)
        n = _common_prefix(prompts)
        if B < 2 or n < MIN_SHARED_PREFIX:
            return [], torch.zeros((B, 0), dtype=torch.long, device=self.device), [0] * B
        ids = torch.tensor([prompts[0][:n]], dtype=torch.long, device=self.device)
        cache = Cache(layer_class_to_replicate=lambda: _BufferLayer(n))
        self.model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True,
                   logits_to_keep=1)
        room = max(len(p) for p in prompts) + spec.max_new_tokens
        layers = []
        for old in cache.layers:
            new = []
            for buf in (old.buf_k, old.buf_v):
                fresh = buf.new_empty(B, room, *buf.shape[2:])
                fresh[:, :n] = buf[:, :n]
                new.append(fresh)
            layers.append(_BufferLayer(room, *new, n))
        return layers, torch.ones((B, n), dtype=torch.long, device=self.device), [n] * B

    def _reuse(self, kept: _TurnCache | None, prompts: list[list[int]], spec: SamplingSpec
               ) -> tuple[list[_BufferLayer], torch.Tensor, list[int]]:
        """The cache this call starts from: per prompt, the kept row it extends, its valid
        columns gathered right-aligned (masked columns and dropped rows go), in buffers with
        room for this call. Returns (layers, mask (B, W), cached tokens per prompt)."""
        B = len(prompts)
        rows = kept.match(prompts) if kept is not None else [-1] * B
        if all(r < 0 for r in rows):
            return [], torch.zeros((B, 0), dtype=torch.long, device=self.device), [0] * B
        cached = [len(kept.seqs[r]) if r >= 0 else 0 for r in rows]
        src = torch.tensor([max(r, 0) for r in rows], device=self.device)
        width = max(cached)
        # A stable sort puts each row's masked columns first and its valid ones, in order, last.
        cols = torch.sort(kept.mask[src], dim=1, stable=True).indices[:, -width:]
        mask = kept.mask[src].gather(1, cols)
        mask[torch.tensor([r < 0 for r in rows], device=self.device)] = 0
        room = width + max(len(p) - n for p, n in zip(prompts, cached)) + spec.max_new_tokens
        flat = ((src * kept.layers[0].capacity)[:, None] + cols).flatten()
        layers = []
        for old in kept.layers:
            new = []
            for buf in (old.buf_k, old.buf_v):
                fresh = buf.new_empty(B, room, *buf.shape[2:])
                fresh[:, :width] = buf.flatten(0, 1).index_select(0, flat).view(B, width, *buf.shape[2:])
                new.append(fresh)
            layers.append(_BufferLayer(room, *new, width))
        return layers, mask, cached
