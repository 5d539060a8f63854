"""The task suite: its preset, its table (warm-up, final, gain seed by seed), and the flow end to
end on two tiny tasks (one warm-up and two runs each, nested MLflow runs, one table)."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import yaml

from agentr1.config import ConfigError
from agentr1.suite import suite_markdown, task_row
from adapters import tracking
from tasks.ablation import base_config
from flows.forms import SuiteParams, load_suite


def run(variant, seed, greedy, sampled):
    return {"variant": variant, "seed": seed, "kind": "rl" if variant == "ppo" else "base", "train_seconds": 1.0,
            "final": {"greedy/em": greedy, "sampled/em": sampled}}


def test_a_tasks_gain_is_taken_seed_by_seed():
    runs = [run("base-tool-call", 0, 0.5, 0.4), run("base-tool-call", 1, 0.6, 0.4),
            run("ppo", 0, 0.7, 0.5), run("ppo", 1, 0.7, 0.6)]
    row = task_row("shop", runs)
    assert row.seeds == 2
    assert row.warmup["greedy/em"] == pytest.approx((0.55, math.sqrt(0.005)))
    assert row.final["greedy/em"] == pytest.approx((0.7, 0.0))
    assert row.gain["greedy/em"] == pytest.approx((0.15, math.sqrt(0.005)))  # gains 0.2 and 0.1
    assert row.gain["sampled/em"][0] == pytest.approx(0.15)
    text = suite_markdown([row, task_row("units", [run("base-tool-call", 0, 0.9, 0.9), run("ppo", 0, 0.8, 0.9)])])
    assert "| shop | 2 | 0.550 ± 0.071 | 0.700 ± 0.000 | +0.150 ± 0.071 |" in text
    assert "| units | 1 | 0.900 | 0.800 | -0.100 |" in text
    assert "Mean gain over the 2 tasks: greedy/em +0.025, sampled/em +0.075." in text


def test_a_task_without_its_warm_up_or_recipe_run_is_an_error():
    with pytest.raises(ValueError, match="no ppo run finished"):
        task_row("shop", [run("base-tool-call", 0, 0.5, 0.4)])


def test_the_suite_sets_variants_seeds_and_roots_and_checks_every_task(tmp_path, registry_restored):
    spec = load_suite(SuiteParams(overrides=["seeds=[0]", "ppo.iterations=2"], output_dir=str(tmp_path)))
    shop = spec.task_spec("shop")
    assert shop.variants == ["base-tool-call", "ppo"] and shop.seeds == [0]
    assert shop.output_dir == str(tmp_path / "shop") and shop.overrides[-1] == "ppo.iterations=2"
    assert shop.policy == "recipe" and base_config(shop).ppo.dev_every == 5  # the recipe as a user gets it
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"tasks": {"shop": {"base": "shop", "seeds": [1]}}}))
    with pytest.raises(ConfigError, match="set by the suite"):
        load_suite(SuiteParams(preset=str(bad)))
    bad.write_text(yaml.safe_dump({"tasks": {"shop": {"base": "shop", "curve": {"evry": 5}}}}))
    with pytest.raises(ConfigError, match=r"(?s)suite task 'shop'.*curve\.evry"):
        load_suite(SuiteParams(preset=str(bad)))


TINY_TASK = ["sft.episodes=48", "sft.steps=4", "sft.batch_size=8", "sft.warmup_steps=1", "sft.corpus_steps=0",
             "ppo.iterations=2", "ppo.episodes_per_iter=8", "ppo.minibatch_size=8", "eval.max_examples=4",
             "model.vocab_size=300", "model.hidden_size=32", "model.num_layers=1"]


@pytest.mark.slow
def test_the_suite_flow_runs_every_task_nests_their_runs_and_is_reported(prefect_api, tmp_path, monkeypatch):
    from flows.suite import suite

    tasks = {name: {"base": base, "overrides": [f"data.dir={tmp_path / name}", "data.synth.n_train=48",
                                                "data.synth.n_dev=4", "data.synth.n_test=8"],
                    "curve": {"every": 2, "split": "dev", "max_examples": 2}, "runner": {"kind": "sequential"}}
             for name, base in (("search", "quick"), ("units", "units"))}
    preset = tmp_path / "suite.yaml"
    # With dev selection (each run's result is its best policy on dev) and a relative root, as a user runs it.
    preset.write_text(yaml.safe_dump({"tasks": tasks, "seeds": [0], "study": "tiny-suite",
                                      "overrides": [*TINY_TASK, "ppo.dev_every=1", "ppo.dev_examples=2"]}))
    res = suite(SuiteParams(preset=str(preset), output_dir=os.path.relpath(tmp_path / "out")))

    text = Path(res["results_md"]).read_text()
    assert "| search | 1 |" in text and "| units | 1 |" in text and "Mean gain over the 2 tasks" in text
    assert set(res["tasks"]) == {"search", "units"} and all(math.isfinite(g) for g in res["mean_gain"].values())
    assert (tmp_path / "out" / "units.yaml").is_file() and (tmp_path / "out" / "units" / "results.md").is_file()
    assert (tmp_path / "out" / "units" / "runs" / "ppo" / "seed-0" / "checkpoints" / "best" / "best.json").is_file()
    c = tracking.client()
    experiment = c.get_run(res["run_id"]).info.experiment_id
    kids = c.search_runs([experiment], f"tags.mlflow.parentRunId = '{res['run_id']}'")
    assert sorted(k.data.tags[tracking.TAG_SUITE_TASK] for k in kids) == ["search", "units"]
    assert {k.data.tags[tracking.TAG_STUDY] for k in kids} == {"tiny-suite.search", "tiny-suite.units"}
    grandchildren = c.search_runs([experiment], f"tags.mlflow.parentRunId = '{res['tasks']['units']}'")
    assert sorted(g.data.tags["ablation.variant"] for g in grandchildren) == ["base-tool-call", "ppo"]
    assert "mean_gain/greedy/em" in c.get_run(res["run_id"]).data.metrics

    # The published table: agentr1 report finds the suite by its study, renders it from the export,
    # and the export imported into another store reports the same records.
    from agentr1.report import read_export
    from adapters.report import import_study, write_study_report

    written = write_study_report("tiny-suite", tmp_path / "results")
    study = read_export(written["export"])
    assert study.kind == "suite" and sorted({r.warmup for r in study.records}) == ["search", "units"]
    published = written["markdown"].read_text()
    assert "| search | 1 |" in published and "| units | 1 |" in published and written["plot"].stat().st_size
    assert published.count("Mean gain over the 2 tasks") == 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    assert len(import_study(written["export"])) == 1 + 2 + 4  # the suite, a parent per task, a run per cell
    again = write_study_report("tiny-suite", tmp_path / "again")
    assert read_export(again["export"]).records == study.records
