"""Atomic, resumable checkpoints.

A checkpoint directory holds ``policy/`` (a plain Hugging Face directory plus
``value_head.safetensors``), ``trainer_state.pt`` (optimizer, scheduler, RNG states) and
``state.json`` (iteration, metric history). It is written to a temporary sibling and renamed
into place, so a crash never leaves a half-written checkpoint under the final name.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from agentr1.fsutil import atomic_dir

STATE_FILE = "state.json"
TRAINER_FILE = "trainer_state.pt"
POLICY_DIR = "policy"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, save_policy: Callable[[Path], None], optimizer, scheduler,
                    iteration: int, state: dict[str, Any]) -> Path:
    def write(tmp: Path) -> None:
        save_policy(tmp / POLICY_DIR)
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "rng": rng_state(), "iteration": iteration}, tmp / TRAINER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({"iteration": iteration, **state}, indent=1))

    return atomic_dir(path, write)


def load_trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(Path(path) / TRAINER_FILE, weights_only=False)


def load_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())
