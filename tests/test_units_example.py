"""The "Add a tool" example (docs/add-a-tool.md) trains end to end through the CLI, from a
plug-in file alone: `agentr1 train --config conf/units.yaml`, with a tiny budget here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults_registry import empty_db, fresh_store  # noqa: F401  (fixtures: a store of this test's own)

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


@pytest.mark.slow
def test_a_plugin_with_its_own_data_file_registers_and_is_served_without_its_dataset(prefect_api, fresh_store,  # noqa: F811
                                                                                    tmp_path, capsys):
    """docs/examples/shop.py: its generator writes catalogue.json beside the records, and its
    lookup_price tool (a factory) reads it. Trained and registered by the pipeline, the model
    carries the catalogue: with the dataset moved away, `agentr1 ask --model champion` and
    `mlflow models serve` answer, and the served tool reads the logged copy."""
    import mlflow
    from test_agent_model import post_questions, scoring_server

    from cli.main import main
    from flows.pipeline import pipeline
    from adapters import tracking
    from agentr1.presets import DataSource
    from flows.forms import PipelineParams

    data = tmp_path / "data"
    overrides = [f"data.dir={data}", "data.synth.n_train=48", "data.synth.n_dev=4", "data.synth.n_test=8",
                 "sft.episodes=48", "sft.steps=4", "sft.batch_size=8", "sft.warmup_steps=1", "ppo.iterations=1",
                 "ppo.episodes_per_iter=8", "ppo.minibatch_size=8", "eval.batch_size=8", "model.vocab_size=300",
                 "model.hidden_size=32", "model.num_layers=1"]
    result = pipeline(PipelineParams(preset="conf/shop.yaml", overrides=overrides, output_dir=str(tmp_path / "run"),
                                     data=DataSource(version=False)))
    prices = json.loads((data / "catalogue.json").read_text())
    data.rename(tmp_path / "moved")  # nothing may read the dataset from here on
    champion = f"models:/{result['registered_model']}@champion"
    assert result["registered_model"] == tracking.model_name("shop") and result["promotion"]["promoted"]

    assert main(["ask", "--model", champion, "--json", "How much is the lamp in EUR?"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)["results"]
    assert answer["question"] == "How much is the lamp in EUR?" and answer["turns"] >= 1
    tracking.client()  # MLflow's global URI: this test's store
    agent = mlflow.pyfunc.load_model(champion).unwrap_python_model().agent
    assert agent.env.tool("lookup_price").run_batch([{"item": "lamp"}])[0][0].text == f"{prices['lamp']:.2f} USD"
    with scoring_server(champion) as url:
        status, body = post_questions(url, ["How much is the mug in GBP?"])
    assert status == 200 and body["predictions"][0]["question"] == "How much is the mug in GBP?"


def test_the_basket_example_demonstrates_five_calls_copied_from_its_tools(tmp_path):
    """docs/examples/basket.py: the gold episode looks three prices up in the file its generator
    wrote and adds them two at a time (five calls, each number copied from an earlier answer);
    the demonstrator plays it to the right total every time."""
    from agentr1.config import load_config
    from agentr1.env.episodes import run_episodes
    from agentr1.env.registry import resolve
    from agentr1.recipe.workspace import Workspace

    cfg = resolve(load_config("conf/basket.yaml", [f"data.dir={tmp_path / 'data'}", "data.synth.n_train=12",
                                                   "data.synth.n_dev=2", "data.synth.n_test=2"]))
    ws = Workspace.build(cfg)
    assert (tmp_path / "data" / "prices.json").is_file()
    transcripts = run_episodes(ws.env, ws.env.demonstrator(None, 0), ws.split("train"))
    assert [(t.metrics["em"], t.metrics["n_calls"]) for t in transcripts] == [(1.0, 5.0)] * 12
    prices = [float(o) for o in transcripts[0].observations[:3]]
    assert transcripts[0].observations[4] == f"{sum(prices):.2f}" == ws.split("train")[0].answers[0]
