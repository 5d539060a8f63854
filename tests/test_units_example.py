"""The "Add a tool" example (docs/add-a-tool.md) trains end to end through the CLI, from a
plug-in file alone: `agentr1 train --config conf/units.yaml`, with a tiny budget here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_units_example_trains_from_its_plugin(tmp_path):
    overrides = [f"data.dir={tmp_path / 'data'}", f"output_dir={tmp_path / 'run'}",
                 "data.synth.n_train=64", "data.synth.n_dev=8", "data.synth.n_test=16",
                 "sft.episodes=64", "sft.steps=4", "ppo.iterations=1", "ppo.episodes_per_iter=8",
                 "ppo.minibatch_size=8", "eval.batch_size=16"]
    cmd = [sys.executable, "-m", "cli", "train", "--config", "conf/units.yaml"]
    for o in overrides:
        cmd += ["-o", o]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    # Its tool returns a plain string (no keys): the run says that process_new_support never pays.
    assert "no demonstration found a gold key" in out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"greedy/em", "sampled/em"} <= set(summary["final"])
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    # The data came from the plug-in's generator, each record with its gold call.
    first = json.loads((tmp_path / "data" / "qa" / "train.jsonl").read_text().splitlines()[0])
    assert first["calls"][0]["name"] == "convert" and first["source"] == "units"
    # The episodes called the plug-in's tool (well-formed or not, the transcript names it).
    assert '"name": "convert"' in (tmp_path / "run" / "trajectories_final.txt").read_text()
