"""Pretrained instruct checkpoints (the GPU path) as actor-critics, with optional LoRA.

The checkpoint keeps its own tokenizer and chat template (``ChatFormat`` derives the
token pieces from it); the value head is new unless the directory holds
``value_head.safetensors`` (a checkpoint written by ``save_actor_critic``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from agentr1.rundir import ADAPTER_CONFIG_FILE
from models.policy import ActorCritic, load_actor_critic


@dataclass
class LoraSpec:
    """LoRA adapters on the attention projections (peft)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


def apply_lora(model: ActorCritic, spec: LoraSpec) -> ActorCritic:
    """Wrap the policy in peft LoRA: only adapter weights and the value head stay trainable."""
    from peft import LoraConfig, get_peft_model  # optional dependency of this path only

    config = LoraConfig(
        r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules), task_type="CAUSAL_LM",
    )
    model.policy = get_peft_model(model.policy, config)  # freezes the base weights
    model.value_head.requires_grad_(True)
    return model


def load_pretrained(
    name_or_path: str | Path,
    lora: LoraSpec | None = None,
    local_files_only: bool = True,
    dtype: torch.dtype | None = None,
) -> tuple[ActorCritic, PreTrainedTokenizerBase]:
    """An instruct checkpoint (local directory or hub id already in the HF cache) as an
    ``ActorCritic`` and its tokenizer.

    A directory written for a LoRA policy (``adapter_config.json``) is loaded as base +
    adapter and keeps training that adapter; ``lora`` adds a new one to a plain checkpoint.
    """
    model, tokenizer = load_actor_critic(name_or_path, dtype=dtype, local_files_only=local_files_only)
    if not tokenizer.chat_template:
        raise ValueError(f"{name_or_path}: tokenizer has no chat_template; an instruct checkpoint is needed")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs a pad id; eos is never attended
    is_adapter = (Path(name_or_path) / ADAPTER_CONFIG_FILE).is_file()
    if lora is not None and not is_adapter:
        model = apply_lora(model, lora)
    return model, tokenizer
