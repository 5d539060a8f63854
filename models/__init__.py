"""The networks: tokenizer + chat template for the from-scratch model, chat token pieces,
actor-critic policy (causal LM + value head) and loading of pretrained checkpoints."""

from models.chat import ChatFormat
from models.policy import (
    ActorCritic,
    ModelSpec,
    build_policy,
    count_parameters,
    load_actor_critic,
    save_actor_critic,
)
from models.pretrained import LoraSpec, apply_lora, load_pretrained
from models.tokenizer import SPECIAL_TOKENS, build_tokenizer

__all__ = [
    "SPECIAL_TOKENS", "ActorCritic", "ChatFormat", "LoraSpec", "ModelSpec", "apply_lora", "build_policy",
    "build_tokenizer", "count_parameters", "load_actor_critic", "load_pretrained", "save_actor_critic",
]
