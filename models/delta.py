"""A policy trained from a catalog model, stored as what training changed.

SmolLM2-135M trains only its top layers (``model.trainable_layers``): a full copy of it in every
checkpoint, ``final/`` and registered version repeats ~0.4 GB of weights that are the catalog
build's, byte for byte. A policy directory whose weights came from a catalog build
(``models/catalog.py``: ``model-cache/<name>``, with its build record) therefore holds, instead
of ``model.safetensors``:

- ``delta.safetensors``: every tensor that differs from the base's (or that the base lacks);
- ``agentr1_base.json``: the base's directory and catalog name, and the sha256 of its
  ``model.safetensors``;

next to the config, tokenizer, generation config and value head as before. Loading reads the
base, checks its sha256 (a mismatch is refused with one line: the delta would apply to other
weights) and applies the delta; what comes out equals what was saved. ``agentr1 model export``
writes a standalone directory (full weights) for use without the base.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers.utils import SAFE_WEIGHTS_NAME

from agentr1.fsutil import DamagedError
from agentr1.fsutil import file_sha256
from models.catalog import BUILD_FILE, DEFAULT_CACHE

BASE_FILE = "agentr1_base.json"
DELTA_FILE = "delta.safetensors"
WEIGHTS_FILE = SAFE_WEIGHTS_NAME  # "model.safetensors", as save_pretrained writes it
DIGEST_FILE = WEIGHTS_FILE + ".sha256"
"""Beside a base's weights: "sha256 size mtime_ns", so the 0.5 GB are hashed once, not per load."""


@dataclass(frozen=True)
class Base:
    """The catalog build a policy's weights came from."""

    path: Path
    name: str
    sha256: str


def weights_sha256(base_dir: Path) -> str:
    """sha256 of ``base_dir/model.safetensors``, from its digest file while the weights' size and
    modification time are those it was computed for (written when it is not)."""
    weights, digest = base_dir / WEIGHTS_FILE, base_dir / DIGEST_FILE
    stat = weights.stat()
    stamp = f"{stat.st_size} {stat.st_mtime_ns}"
    try:
        sha, _, seen = digest.read_text().strip().partition(" ")
        if seen == stamp and len(sha) == 64:
            return sha
    except OSError:
        pass
    sha = file_sha256(weights)
    try:
        digest.write_text(f"{sha} {stamp}\n")
    except OSError:  # a read-only cache: hashed again next time
        pass
    return sha


def as_base(path: str | Path) -> Base | None:
    """``path`` as a base when it is a catalog build with one weights file; else None."""
    path = Path(path)
    if not ((path / BUILD_FILE).is_file() and (path / WEIGHTS_FILE).is_file()):
        return None
    name = json.loads((path / BUILD_FILE).read_text()).get("source", {}).get("name", path.name)
    return Base(path.resolve(), name, weights_sha256(path))


def changed_tensors(state: dict[str, torch.Tensor], base: Base) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` (a policy's ``state_dict``) that the base does not hold as they
    are; a tensor that shares its storage with one the base holds (a tied LM head) is not one."""
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(base.path / WEIGHTS_FILE), framework="pt") as weights:
        held = set(weights.keys())
        shared = {state[k].data_ptr() for k in state if k in held}
        for key, tensor in state.items():
            if key in held:
                was = weights.get_tensor(key)
                same = tensor.dtype == was.dtype and tensor.shape == was.shape and torch.equal(tensor.detach().cpu(), was)
            else:
                same = tensor.data_ptr() in shared
            if not same:
                out[key] = tensor.detach().cpu().contiguous()
    return out


def write_delta(state: dict[str, torch.Tensor], base: Base, out: Path) -> None:
    """``delta.safetensors`` and ``agentr1_base.json`` of ``state`` against ``base`` into ``out``."""
    changed = changed_tensors(state, base)
    save_file(changed, str(out / DELTA_FILE), metadata={"base_sha256": base.sha256})
    record = {"path": str(base.path), "name": base.name, "sha256": base.sha256, "tensors": len(changed)}
    (out / BASE_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))


def is_delta(path: str | Path) -> bool:
    return (Path(path) / BASE_FILE).is_file()


def base_for(path: str | Path) -> Base:
    """The base the delta in ``path`` applies to, found where it was (else in ``model-cache/``)
    and checked: a missing base or one with other weights is refused with what to do."""
    path = Path(path)
    try:
        record = json.loads((path / BASE_FILE).read_text())
        want, name = record["sha256"], record["name"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DamagedError(f"{path / BASE_FILE}: unreadable ({exc}); restore the checkpoint or train it again") from exc
    for where in (Path(record.get("path", "")), DEFAULT_CACHE / name):
        if (where / WEIGHTS_FILE).is_file():
            found = weights_sha256(where)
            if found != want:
                raise DamagedError(
                    f"{path}: trained from {name} with weights sha256 {want[:12]}, but {where} holds {found[:12]}: "
                    f"the delta would apply to other weights; rebuild the base (`agentr1 model build {name}`) or use a "
                    "standalone export (`agentr1 model export`)")
            return Base(where.resolve(), name, found)
    raise DamagedError(f"{path}: its base model {name} is not at {record.get('path')} nor in {DEFAULT_CACHE}/: "
                       f"`agentr1 model build {name}` (or `make model`) builds it; `agentr1 model export` writes a "
                       "standalone copy of a policy")


def read_delta(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(path) / DELTA_FILE))
