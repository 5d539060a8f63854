"""Actor-critic: a transformers causal LM (the policy) plus a linear value head on its trunk.

Notation: B batch, T sequence length, V vocabulary, H hidden size.

One forward pass gives both the next-token logits (B, T, V) and per-position values (B, T)
from the same last hidden states. ``.policy`` is the plain causal LM, so generation with a
KV cache, ``save_pretrained`` and vLLM see an ordinary Hugging Face checkpoint; the value
head lives next to it in ``value_head.safetensors``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from agentr1.config import ModelConfig
from agentr1.fsutil import DamagedError, atomic_dir, verify_manifest
from agentr1.rl.guard import assert_finite
from agentr1.rundir import ADAPTER_CONFIG_FILE, VALUE_HEAD_FILE
from models.delta import DELTA_FILE, as_base, base_for, is_delta, read_delta, write_delta
from models.tokenizer import single_token_ids

BASE_ATTR = "agentr1_base"
"""A loaded policy's :class:`models.delta.Base`, when its weights came from a catalog build."""
# Generation stops at any of these (those that are single tokens): end of turn, end of a
# tool call or answer, end of text. vLLM and generate() read them from generation_config.
STOP_TOKENS = ("<|im_end|>", "</tool_call>", "</answer>", "<|endoftext|>")


@dataclass
class ModelSpec:
    """Shape of the from-scratch decoder (a Qwen2 architecture). The shape has no defaults here:
    it comes from the validated config's ``model`` section (:meth:`from_config`), where the
    default run's values live; only architecture constants the config does not expose do."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    init_std: float
    """std of the normal init of every weight matrix. transformers' default, 0.02, is tuned for
    wide models: at hidden 128 it leaves attention logits so flat that a 4-layer model had not
    learned to copy 6 tokens after 400 steps, where 0.05 learns it in ~100 (measured:
    docs/experiments/2026-11-30-learning-to-copy.md, item 2)."""
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    dropout: float = 0.0
    """attention dropout; 0 keeps PPO's old/new log-probs comparable"""

    @classmethod
    def from_config(cls, model: ModelConfig, **changes) -> "ModelSpec":
        """The shape in ``model`` (``agentr1.config.ModelConfig``), with ``changes`` applied."""
        shape = {f: getattr(model, f) for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                                "intermediate_size", "max_position_embeddings", "init_std")}
        return cls(**{**shape, **changes})


class ActorCritic(nn.Module):
    """Causal LM policy + value head (Linear(H, 1), zero-initialised so initial values are 0).

    The policy may be a peft ``PeftModel`` (LoRA); the value head then reads the trunk with
    the adapters active.

    With ``frozen_layers = k`` (:func:`train_top_layers`) the embeddings and the first ``k``
    decoder layers never change, so their output for a batch (:meth:`trunk_states`, (B, T, H))
    can be computed once and handed to every later pass over the same batch (``trunk=``): the
    reference policy, the value and each PPO epoch then run only the layers above ``k``.
    """

    frozen_layers: int = 0
    compiled: bool = False
    """True once :func:`compile_layers` compiled the decoder layers: the losses then read the LM
    head's logits through a compiled function too (``agentr1.rl.core.token_stats_for``)."""

    def __init__(self, policy: nn.Module, value_head: nn.Linear | None = None):
        super().__init__()
        self.policy = policy
        hidden = _base_lm(policy).config.hidden_size
        if value_head is None:
            value_head = nn.Linear(hidden, 1)
            nn.init.zeros_(value_head.weight)
            nn.init.zeros_(value_head.bias)
        self.value_head = value_head.float()  # fp32 even when the trunk runs in bf16

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      position_ids: torch.Tensor | None = None, trunk: torch.Tensor | None = None) -> torch.Tensor:
        """The trunk's last hidden states (B, T, H): what the LM head and the value head read.
        ``trunk`` (B, T, H): :meth:`trunk_states` of this batch; only the layers above run."""
        if trunk is None and self.frozen_layers:
            trunk = self.trunk_states(input_ids, attention_mask, position_ids)
        if trunk is not None:
            return run_decoder_layers(_base_lm(self.policy).model, trunk, attention_mask, position_ids,
                                      self.frozen_layers, None, final_norm=True)
        return _base_lm(self.policy).model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state

    @torch.no_grad()
    def trunk_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                     position_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """The output of the frozen layers (B, T, H), or None when none is frozen. They run
        forward only, so with SDPA attention whatever the trainable layers use
        (:func:`attention_for_precision`): its forward is the faster on a CPU, 2.1x the eager
        one for SmolLM2 on batches of 8 x 510 tokens in bf16 (benchmarks/warmup_step.py)."""
        if not self.frozen_layers:
            return None
        lm = _base_lm(self.policy)
        base, kept = lm.model, lm.config._attn_implementation
        lm.config._attn_implementation = "sdpa"  # one attribute every layer reads at each call
        try:
            return run_decoder_layers(base, base.embed_tokens(input_ids), attention_mask, position_ids, 0,
                                      self.frozen_layers, final_norm=False)
        finally:
            lm.config._attn_implementation = kept

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_at: torch.Tensor | None = None,
        trunk: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids (B, T) -> (logits (B, T, V) float32, values (B, T) float32).

        ``attention_mask`` (B, T) is 1 on real tokens; ``position_ids`` (B, T) override the
        default 0..T-1 (e.g. for left padding). ``logits_at`` (B, T) bool computes logits only
        at those positions, returned packed as (N, V) in row-major order: the LM head is a
        third of a small model's forward, and training needs logits at action tokens only.
        ``trunk``: this batch's :meth:`trunk_states`, to skip the frozen layers.
        """
        lm = _base_lm(self.policy)
        hidden = self.hidden_states(input_ids, attention_mask, position_ids, trunk)
        values = self.value_head(hidden.float()).squeeze(-1)
        if logits_at is not None:
            hidden = hidden[logits_at]
        logits = lm.get_output_embeddings()(hidden).float()
        return logits, values


def run_decoder_layers(base: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                       position_ids: torch.Tensor | None, start: int, stop: int | None,
                       final_norm: bool) -> torch.Tensor:
    """Decoder layers ``start:stop`` of a Llama/Qwen2-style ``base`` model (``lm.model``) on
    ``hidden`` (B, T, H), as its own ``forward`` runs them (causal mask from ``attention_mask``,
    rotary embeddings from ``position_ids``, default 0..T-1), then the final norm if asked.
    No KV cache: for training passes over whole sequences."""
    from transformers.masking_utils import create_causal_mask

    kinds = set(getattr(base.config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise NotImplementedError(f"model.trainable_layers: layer types {sorted(kinds)} (sliding-window "
                                  "attention) are not supported; train every layer (model.trainable_layers: null)")
    if position_ids is None:
        position_ids = torch.arange(hidden.shape[1], device=hidden.device)[None]
    mask = create_causal_mask(config=base.config, inputs_embeds=hidden, attention_mask=attention_mask,
                              past_key_values=None, position_ids=position_ids)
    position_embeddings = base.rotary_emb(hidden, position_ids=position_ids)
    for layer in base.layers[start:stop]:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                       position_ids=position_ids, past_key_values=None, use_cache=False)
    return base.norm(hidden) if final_norm else hidden


def train_top_layers(model: ActorCritic, trainable_layers: int | None) -> ActorCritic:
    """Train only the top ``trainable_layers`` decoder layers, the final norm and the value head
    (None: everything); the embeddings (tied to the LM head), the layers below and any LoRA
    adapters there are frozen, and ``model.frozen_layers`` records where the trainable part
    starts (see :class:`ActorCritic`)."""
    if trainable_layers is None:
        return model
    model.frozen_layers = freeze_below_top(_base_lm(model.policy), trainable_layers)
    return model


def compile_layers(model: ActorCritic) -> int:
    """``torch.compile`` (inductor) every decoder layer of ``model``'s policy in place
    (``model.compile``), with dynamic shapes; returns how many. One layer's code serves all of
    them, so this compiles a few small graphs where compiling the whole model would unroll 30
    layers: one without gradients (the frozen trunk, scoring), one for the lowest trainable layer
    (its input needs no gradient) and one for the layers above it. Static shapes would add a
    recompile per graph at the first new length or batch size, and a run (warm-up, then PPO in the
    same process) overflowed dynamo's 8 compiled versions per function: the versions past it ran
    eager. The masks, rotary embeddings, LM head and losses stay eager (the losses' statistics
    have their own compiled function, ``agentr1.rl.core.token_stats_for``), and the module tree and
    its state dict are unchanged (checkpoints, vLLM syncs). On SmolLM2's warm-up step it runs the
    elementwise operators and bf16 casts fused: docs/benchmarks.md."""
    layers = _base_lm(model.policy).model.layers
    for layer in layers:
        layer.compile(dynamic=True)
    model.compiled = True
    return len(layers)


def freeze_below_top(lm: PreTrainedModel, trainable_layers: int) -> int:
    """Freeze a causal LM's embeddings (tied to its LM head), its LM head and every decoder layer
    below the top ``trainable_layers``; returns how many layers are frozen. What
    :func:`train_top_layers` does to a policy, for a bare model (a peer's trainer in
    ``benchmarks/vs_trl.py``)."""
    n = len(lm.model.layers)
    if not 1 <= trainable_layers <= n:
        raise ValueError(f"model.trainable_layers: {trainable_layers}, the model has {n} decoder layers")
    frozen = n - trainable_layers
    lm.model.embed_tokens.requires_grad_(False)
    lm.get_output_embeddings().requires_grad_(False)
    for layer in lm.model.layers[:frozen]:
        layer.requires_grad_(False)
    return frozen


def without_dropout(model: nn.Module) -> int:
    """Set every dropout in ``model`` to 0 (``nn.Dropout`` modules, LoRA's ``lora_dropout``
    included, and the attention's own rate); returns how many were not 0. PPO compares the
    policy's log-probs in the update with those scored before it: with dropout on in one and not
    the other, the ratio is noise before any step (peft's LoRA default is 0.05)."""
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p:
            module.p, changed = 0.0, changed + 1
        rate = getattr(module, "attention_dropout", None)
        if isinstance(rate, float) and rate:
            module.attention_dropout, changed = 0.0, changed + 1
    return changed


EAGER_BELOW_HEAD_DIM = 64
"""Attention heads narrower than this train with eager attention under bf16 on a CPU."""


def ready_to_train(model: ActorCritic, device: torch.device, mixed_precision: str, compile: bool) -> int:
    """What the warm-up and PPO do to a model before their first step: the attention kernel for
    the training precision (:func:`attention_for_precision`), then with ``compile``
    (``model.compile``) every decoder layer compiled (:func:`compile_layers`); returns how many
    layers were compiled (0 without)."""
    attention_for_precision(model, device, mixed_precision)
    return compile_layers(model) if compile else 0


def attention_for_precision(model: ActorCritic, device: torch.device, mixed_precision: str) -> str:
    """Choose the attention kernel for training at ``mixed_precision`` on ``device``; returns it.

    bf16 autocast on CPU runs eager attention for narrow heads (the from-scratch models', 32
    wide): torch's CPU flash-attention backward in bf16 is slow there (0.48 s against eager's
    0.23 s for the default model's step on 32 x 183 tokens), while eager attention's matmuls use
    the CPU's bf16 units like every other layer. For 64-wide heads (SmolLM2, Qwen2.5) SDPA is
    the faster: its backward is on a par and its forward 1.5-2x eager's on prompts of 500-700
    tokens. Everything else keeps the checkpoint's choice (the frozen layers always run SDPA:
    :meth:`ActorCritic.trunk_states`).
    """
    lm = _base_lm(model.policy)
    config = lm.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if device.type == "cpu" and mixed_precision == "bf16" and head_dim < EAGER_BELOW_HEAD_DIM \
            and config._attn_implementation != "eager":
        lm.set_attn_implementation("eager")
    return config._attn_implementation


def _base_lm(policy: nn.Module) -> PreTrainedModel:
    """The transformers CausalLM under an optional peft wrapper (LoRA layers stay in it)."""
    return policy.get_base_model() if hasattr(policy, "get_base_model") else policy


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (shared/tied tensors counted once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        if p.requires_grad or not trainable_only:
            seen[id(p)] = p.numel()
    return sum(seen.values())


def build_policy(spec: ModelSpec, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> ActorCritic:
    """A freshly initialised Qwen2ForCausalLM sized by ``spec`` with vocab ``len(tokenizer)``.

    Initialisation uses its own RNG stream seeded by ``seed`` (the global RNG is untouched).
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        attention_dropout=spec.dropout,
        initializer_range=spec.init_std,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = Qwen2ForCausalLM(config)
    policy.generation_config = GenerationConfig(
        eos_token_id=single_token_ids(tokenizer, STOP_TOKENS), pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return ActorCritic(policy)


def save_actor_critic(model: ActorCritic, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Write a plain Hugging Face directory (model or LoRA adapter, tokenizer with its chat
    template, generation config) plus ``value_head.safetensors``; a policy whose weights came
    from a catalog build holds only what training changed (``models/delta.py``).

    Written to a temporary sibling and renamed, so ``out_dir`` is never half-written; a model
    holding NaN/inf is refused (:class:`~agentr1.rl.guard.TrainingDiverged`), never written.
    """
    assert_finite(model, f"saving {out_dir}")

    base = getattr(model.policy, BASE_ATTR, None)  # set when the weights came from a catalog build

    def write(tmp: Path) -> None:
        if base is not None and not hasattr(model.policy, "peft_config"):  # models/delta.py
            model.policy.config.save_pretrained(tmp)
            model.policy.generation_config.save_pretrained(tmp)
            write_delta(model.policy.state_dict(), base, tmp)
        else:
            model.policy.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        head = {k: v.detach().float().cpu().contiguous() for k, v in model.value_head.state_dict().items()}
        save_file(head, str(tmp / VALUE_HEAD_FILE))

    need = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return atomic_dir(out_dir, write, manifest=True, need=need)


def load_causal_lm(path: str | Path, dtype: torch.dtype | None = None, local_files_only: bool = True) -> nn.Module:
    """A causal LM from a HF directory/hub id, or base + LoRA adapter from an adapter directory.
    A checkpoint missing a weight is refused (transformers would initialise it at random)."""
    adapter_cfg = Path(path) / ADAPTER_CONFIG_FILE
    if adapter_cfg.is_file():
        from peft import PeftModel  # only LoRA checkpoints need peft

        base_path = json.loads(adapter_cfg.read_text())["base_model_name_or_path"]
        base = _complete(base_path, dtype, local_files_only)
        return PeftModel.from_pretrained(base, str(path), is_trainable=True)
    if is_delta(path):
        return _with_delta(path, dtype)
    model = _complete(path, dtype, local_files_only)
    if Path(path).is_dir() and (base := as_base(path)) is not None:
        setattr(model, BASE_ATTR, base)
    return model


def _with_delta(path: str | Path, dtype: torch.dtype | None) -> nn.Module:
    """The base the directory names, checked, with the directory's changed tensors applied."""
    base = base_for(path)
    model = _complete(base.path, dtype, True, config=AutoConfig.from_pretrained(str(path), local_files_only=True))
    result = model.load_state_dict(read_delta(path), strict=False)
    if result.unexpected_keys:
        raise DamagedError(f"{path}: {DELTA_FILE} holds {len(result.unexpected_keys)} tensor(s) the model lacks "
                           f"({sorted(result.unexpected_keys)[0]}, ...): restore the checkpoint or train it again")
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(path))
    setattr(model, BASE_ATTR, base)
    return model


def _complete(path: str | Path, dtype: torch.dtype | None, local_files_only: bool, config=None) -> nn.Module:
    extra = {"config": config} if config is not None else {}
    model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=local_files_only,
                                                       output_loading_info=True, **extra)
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise DamagedError(f"{path}: the checkpoint lacks {len(missing)} weight(s) the model needs ({missing[0]}, ...): "
                           "transformers would initialise them at random; restore the checkpoint or train it again")
    return model


def load_value_head(path: str | Path, hidden_size: int) -> nn.Linear | None:
    """The saved value head in directory ``path``, or None when there is none."""
    file = Path(path) / VALUE_HEAD_FILE
    if not file.is_file():
        return None
    state = load_file(str(file))
    if tuple(state["weight"].shape) != (1, hidden_size):
        raise ValueError(f"{file}: field 'weight': shape {tuple(state['weight'].shape)}, expected (1, {hidden_size})")
    head = nn.Linear(hidden_size, 1)
    head.load_state_dict(state)
    return head


def load_actor_critic(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
    local_files_only: bool = True,
) -> tuple[ActorCritic, PreTrainedTokenizerBase]:
    """Load what ``save_actor_critic`` wrote (or any causal-LM checkpoint: the value head is
    then new). A directory with a manifest (every one agentr1 writes) is checked against it
    first: a missing value head, a truncated or damaged file is refused, never replaced by fresh
    weights. Returns ``(model in eval mode on device, tokenizer)``."""
    if Path(path).is_dir():
        verify_manifest(path, "restore it, or train it again", required=False)
    policy = load_causal_lm(path, dtype=dtype, local_files_only=local_files_only)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=local_files_only)
    head = load_value_head(path, _base_lm(policy).config.hidden_size) if Path(path).is_dir() else None
    model = ActorCritic(policy, head).to(device)
    model.eval()
    return model, tokenizer
