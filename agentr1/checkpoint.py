"""Atomic, resumable checkpoints that load without running code.

A checkpoint directory holds ``policy/`` (a plain Hugging Face directory plus
``value_head.safetensors``), ``trainer_state.pt`` (optimizer, scheduler, RNG states) and
``state.json`` (iteration, metric history). It is written to a temporary sibling and renamed
into place, so a crash never leaves a half-written checkpoint under the final name.

``trainer_state.pt`` holds tensors and plain data only (dicts, lists, tuples, str, int, float,
bool, None) and is read with ``torch.load(weights_only=True)``: a checkpoint is a file a user
may be handed, and a full pickle would run whatever code it names. Python's and numpy's RNG
states (tuples and an ndarray) are therefore stored as lists of ints; torch's as tensors. What
``save_checkpoint`` is given is checked before it is written, so a scheduler or optimizer that
carries a Python object fails at save time, naming the field, not at the next resume.
"""
from __future__ import annotations

import json
import pickle
import random
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from agentr1.fsutil import DamagedError, atomic_dir

STATE_FILE = "state.json"
TRAINER_FILE = "trainer_state.pt"
POLICY_DIR = "policy"
# Version of trainer_state.pt's layout; files written before safe loading have no "format".
TRAINER_FORMAT = 2
# What weights_only=True unpickles besides tensors (torch's own list); checked before writing.
_PLAIN = (str, int, float, bool, type(None))
_TRAINER_KEYS = ("optimizer", "scheduler", "rng", "iteration")


class UnsafeCheckpointError(DamagedError):
    """A trainer state that cannot be loaded without unpickling arbitrary objects."""


# -- RNG states as plain data --------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) global RNG states as lists, ints and tensors."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {"kind": str(kind), "keys": [int(k) for k in keys], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (or a checkpoint's ``"rng"``)."""
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    np.random.set_state((npy["kind"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- saving and loading ---------------------------------------------------------------------------

def check_plain(obj: Any, where: str) -> None:
    """Raise ``TypeError`` naming the first value under ``obj`` that ``torch.load(weights_only=True)``
    would refuse: anything but tensors, dicts with str/int keys, lists, tuples and scalars (a
    numpy scalar or a callable object in a scheduler's ``lr_lambdas`` is refused)."""
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN:
        return
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise TypeError(f"{where}: key {k!r} is a {type(k).__name__}; a checkpoint holds str/int keys only")
            check_plain(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; a checkpoint holds "
                    "tensors and plain data only (it is loaded with torch.load(weights_only=True))")


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor under ``obj`` (a state dict, nested): a write's size, near enough."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_checkpoint(path: Path, save_policy: Callable[[Path], None], optimizer, scheduler,
                    iteration: int, state: dict[str, Any], policy_bytes: int = 0) -> Path:
    """Write ``path`` atomically: the policy (``save_policy(dir)``), the trainer state and
    ``state.json`` (``{"iteration": ..., **state}``); the free space it needs (``policy_bytes`` and
    the trainer state's) is checked first (``agentr1.fsutil.NoSpaceError``)."""
    trainer = {"format": TRAINER_FORMAT, "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict() if scheduler is not None else None,
               "rng": rng_state(), "iteration": int(iteration)}
    check_plain(trainer, TRAINER_FILE)

    def write(tmp: Path) -> None:
        save_policy(tmp / POLICY_DIR)
        torch.save(trainer, tmp / TRAINER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({"iteration": iteration, **state}, indent=1))

    return atomic_dir(path, write, manifest=True, need=policy_bytes + tensor_bytes(trainer))


def load_trainer_state(path: Path) -> dict[str, Any]:
    """``{"optimizer", "scheduler", "rng", "iteration"}`` of the checkpoint in ``path``.

    Read with ``weights_only=True``; a file holding anything else (an old-format checkpoint, or
    a crafted one) raises :class:`UnsafeCheckpointError` naming it, and nothing in it runs.
    """
    file = Path(path) / TRAINER_FILE
    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's own message suggests a full unpickle; a user must not be sent there.
        found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(err))
        detail = found.group(1).split(" was not ")[0] if found else type(err).__name__
        raise UnsafeCheckpointError(
            f"{file}: cannot be loaded safely: it holds something other than tensors and plain data "
            f"({detail}): a checkpoint written before format {TRAINER_FORMAT}, or not written by agentr1. "
            "Not loaded; move the checkpoint directory away to restart PPO from the warm-up."
        ) from None
    except (EOFError, RuntimeError) as err:
        reason = str(err) or type(err).__name__
        raise ValueError(f"{file}: not a readable checkpoint (truncated or corrupt: {reason})") from err
    return _checked(data, file)


def _checked(data: Any, file: Path) -> dict[str, Any]:
    """``data`` if it has the layout ``save_checkpoint`` writes; else an error naming the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a dict of {', '.join(_TRAINER_KEYS)}, got {type(data).__name__}")
    if data.get("format") != TRAINER_FORMAT:
        raise UnsafeCheckpointError(f"{file}: format {data.get('format')!r}, expected {TRAINER_FORMAT}; "
                                    "move the checkpoint directory away to restart PPO from the warm-up")
    missing = [k for k in _TRAINER_KEYS if k not in data]
    if missing:
        raise ValueError(f"{file}: missing field {missing[0]!r}")
    if not isinstance(data["optimizer"], dict):
        raise ValueError(f"{file}: field 'optimizer' must be a dict, got {type(data['optimizer']).__name__}")
    if data["scheduler"] is not None and not isinstance(data["scheduler"], dict):
        raise ValueError(f"{file}: field 'scheduler' must be a dict or None, got {type(data['scheduler']).__name__}")
    if type(data["iteration"]) is not int or data["iteration"] < 0:
        raise ValueError(f"{file}: field 'iteration' must be an int >= 0, got {data['iteration']!r}")
    rng = data["rng"]
    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= rng.keys() \
            or not isinstance(rng["torch"], torch.Tensor):
        raise ValueError(f"{file}: field 'rng' must hold python, numpy and torch (a tensor) states")
    return {k: data[k] for k in _TRAINER_KEYS}


def load_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())
