"""A SmolLM2 policy saved whole against saved as a delta (models/delta.py), side by side.

Why: with ``model.trainable_layers: 8`` (conf/smollm2.yaml) 22 of SmolLM2-135M's 30 layers and
its embeddings never change, yet every ``warmup/``, ``final/``, checkpoint and registered version
held all of them (issue 46: ~2 GB per run, ~0.55 GB per version). This trains nothing: it loads
the catalog build, changes the trainable tensors as an update would, then saves and loads the
same policy both ways and prints, for each, the directory's size and the seconds to save and to
load (the load checks the manifest, and for the delta the base's sha256, as every load does),
and whether the loaded weights equal the saved ones. Usage (after ``make model``)::

    python benchmarks/checkpoint_delta.py [--base model-cache/SmolLM2-135M-Instruct] [--layers 8]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers.utils import logging as transformers_logging

from models.catalog import DEFAULT_CACHE, SMOLLM2_135M
from models.policy import BASE_ATTR, load_actor_critic, save_actor_critic, train_top_layers
from models.pretrained import load_pretrained


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=str(DEFAULT_CACHE / SMOLLM2_135M.name))
    parser.add_argument("--layers", type=int, default=8, help="model.trainable_layers")
    args = parser.parse_args()
    transformers_logging.disable_progress_bar()
    model, tokenizer = load_pretrained(args.base)
    train_top_layers(model, args.layers)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(1e-3 * torch.randn_like(p))
    base = getattr(model.policy, BASE_ATTR)
    want = model.state_dict()
    print(f"{'stored as':<10}{'size MB':>10}{'save s':>9}{'load s':>9}  equal")
    with tempfile.TemporaryDirectory() as tmp:
        for label, base_attr in (("whole", None), ("delta", base)):
            setattr(model.policy, BASE_ATTR, base_attr)
            out = Path(tmp) / label
            t0 = time.perf_counter()
            save_actor_critic(model, tokenizer, out)
            t1 = time.perf_counter()
            loaded, _ = load_actor_critic(out)
            t2 = time.perf_counter()
            got = loaded.state_dict()
            equal = want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
            print(f"{label:<10}{size_mb(out):>10.1f}{t1 - t0:>9.1f}{t2 - t1:>9.1f}  {equal}", flush=True)


if __name__ == "__main__":
    main()
