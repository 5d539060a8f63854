"""Prefect tasks and flows on a tiny world, against one temporary Prefect server.

The served-deployment test runs the pipeline the way the UI's Run button does (a flow run of
a deployment, picked up by a Runner, executed in a subprocess). The other flow tests call the
flows in-process, seeding the run directory with one shared warm-up so they skip it.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_convert import HOTPOT_RECORD
from test_trainer import TINY

from agentr1.config import ConfigError, load_config
from agentr1.data.splits import split_of
from agentr1.data.records import load_dataset
from agentr1.errors import NotFound
from agentr1.recipe.ppo import PPOSession
from agentr1.recipe.warmup import play_demonstrations
from agentr1.recipe.workspace import ensure_data
from adapters import lifecycle, tracking
from flows.forms import AblationParams
from tasks.data import dir_hash, recorded_hash, version_dataset
from agentr1.presets import DataSource, preset_path
from flows.forms import EvaluateParams, PipelineParams, RetrainParams, resolve_config
from adapters.registry import parse_model_ref
from tasks.registry import compare
from adapters.report import metrics_table
from flows.forms import SuiteParams

FAST = ["ppo.iterations=1", "eval.max_examples=4", "env.max_turns=2", "env.max_turn_tokens=8"]
FLOW_RUN_TIMEOUT_S = 240


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("flows") / "data"
    ensure_data(load_config("conf/train.yaml", [f"data.dir={d}", *TINY]))
    return d


def form(data_dir: Path, out: Path, *extra: str, cls=PipelineParams, **fields):
    """A flow form on the tiny world: one PPO iteration (unless ``extra`` says otherwise), and
    short episodes and evaluations, where the time of these flows goes (token by token)."""
    return cls(overrides=[f"data.dir={data_dir}", *TINY, *FAST, *extra], output_dir=str(out),
               data=DataSource(version=False), **fields)


@pytest.fixture(scope="module")
def warm_dir(data_dir, tmp_path_factory) -> Path:
    """One tiny warm-up checkpoint; copied into run dirs so the flows reuse it."""
    from tasks.training import warm_up

    out = tmp_path_factory.mktemp("warm")
    return Path(warm_up.fn(resolve_config(form(data_dir, out), "test")))


def seeded_run(tmp_path: Path, warm_dir: Path) -> Path:
    """A run directory of ours (marker) holding a copy of the shared warm-up."""
    from agentr1.rundir import claim_run_dir

    run = claim_run_dir(tmp_path / "run")
    shutil.copytree(warm_dir, run / "warmup")
    return run


@pytest.fixture(scope="module")
def champion(data_dir, warm_dir) -> str:
    """A registered champion (the warm-up policy) when no test has made one yet."""
    current = tracking.champion(tracking.MODEL_NAME)
    if current is not None:
        return current[0]
    cfg = resolve_config(form(data_dir, warm_dir.parent), "test")  # the warm-up's own config
    with lifecycle.start_run("agentr1-test", "seed-champion") as run_id:
        tracking.log_metrics(run_id, {"eval/final/greedy/em": 0.0}, step=0)
        version = tracking.register(tracking.log_policy_model(run_id, warm_dir, cfg))
    tracking.set_champion(tracking.MODEL_NAME, version)
    return version


def registry_state() -> tuple[list[str], str | None]:
    """(registered versions, champion version)."""
    versions = tracking.client().search_model_versions(f"name='{tracking.MODEL_NAME}'")
    current = tracking.champion(tracking.MODEL_NAME)
    return sorted(str(v.version) for v in versions), current[0] if current else None


def artifacts_of(flow_run_id) -> dict[str, object]:
    """{key: data} of the artifacts a flow run (or its tasks) created."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {a.key: a.data for a in found}


def run_failing(flow, params):
    """Run a flow expected to fail; returns (exception, flow run id)."""
    state = flow(params, return_state=True)
    assert state.is_failed(), state
    with pytest.raises(Exception) as info:
        state.result()
    return info.value, state.state_details.flow_run_id


# ----------------------------------------------------------------------------- parameters


def test_form_resolves_preset_then_knobs_then_overrides(tmp_path):
    cfg = resolve_config(PipelineParams(ppo_iterations=3, loss_mask=False, overrides=["ppo.iterations=5"],
                                        output_dir=str(tmp_path)), "pipeline")
    assert cfg.ppo.iterations == 5, "an override wins over a knob"
    assert cfg.ppo.loss_mask is False and cfg.env.tools_in_prompt is False  # knob; preset value kept
    assert cfg.output_dir == str(tmp_path)


def test_each_flow_run_gets_its_own_directory_unless_one_is_named():
    a, b = (resolve_config(PipelineParams(), "pipeline").output_dir for _ in range(2))
    assert a != b and a.startswith("runs/pipeline/")
    assert resolve_config(PipelineParams(overrides=["output_dir=runs/x"]), "pipeline").output_dir == "runs/x"


def test_bad_preset_and_bad_override_name_the_problem():
    with pytest.raises(FileNotFoundError, match="train"):
        preset_path("nope")
    with pytest.raises(ConfigError, match="ppo.lr"):
        resolve_config(PipelineParams(overrides=["ppo.lr=-1"]), "pipeline")


# ----------------------------------------------------------------------------- data, DVC


def test_converted_records_split_stably_by_id():
    ids = [f"q{i}" for i in range(2000)]
    splits = [split_of(i, 0.1, 0.2) for i in ids]
    assert splits == [split_of(i, 0.1, 0.2) for i in ids]
    assert 0.15 < splits.count("test") / len(ids) < 0.25 and 0.06 < splits.count("dev") / len(ids) < 0.14


def test_converted_dataset_gets_train_dev_test_splits(tmp_path):
    from tasks.data import prepare_data

    records = [{**HOTPOT_RECORD, "_id": f"h{i}"} for i in range(40)]
    source = tmp_path / "hotpot.json"
    source.write_text(json.dumps(records))
    cfg = load_config("conf/train.yaml", [f"data.dir={tmp_path / 'data'}"])
    version = prepare_data.fn(cfg, DataSource(kind="hotpotqa", input=str(source), version=False))
    splits, corpus = load_dataset(tmp_path / "data")
    assert set(splits) == {"train", "dev", "test"} and sum(map(len, splits.values())) == len(records)
    assert {r.id for r in splits["test"]} == {f"h{i}" for i in range(40) if split_of(f"h{i}", 0.1, 0.2) == "test"}
    assert version.source == "hotpotqa" and version.nfiles == 4 and len(corpus) == 3
    with pytest.raises(ValueError, match="input"):
        prepare_data.fn(load_config(None, [f"data.dir={tmp_path / 'other'}"]), DataSource(kind="musique"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inside DVC
def test_dataset_version_is_dvc_hash_and_dvc_add_records_changes(data_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(data_dir, repo / "data")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    first = version_dataset(repo / "data", record=True, source="synthetic")
    assert first.recorded and recorded_hash(repo / "data.dvc") == first.md5 == dir_hash(repo / "data")[0]
    assert not version_dataset(repo / "data", record=True, source="synthetic").recorded, "unchanged: no new version"
    (repo / "data" / "qa" / "dev.jsonl").write_text("")
    changed = version_dataset(repo / "data", record=True, source="synthetic")
    assert changed.recorded and changed.md5 != first.md5 and recorded_hash(repo / "data.dvc") == changed.md5
    outside = version_dataset(data_dir, record=True, source="synthetic")
    assert not outside.recorded and outside.dvc_file is None and outside.md5.endswith(".dir")


def test_tasks_share_one_workspace_but_keep_their_own_config(data_dir, tmp_path):
    from tasks.training import workspace

    a, b, c = (resolve_config(form(data_dir, tmp_path, *extra), "test")
               for extra in ([], ["sft.expert.distractor=0.5"], ["env.top_k=2"]))
    assert workspace(b) is workspace(a) and not hasattr(workspace(a), "cfg")  # the config is each stage's own
    # ... so the demonstrator plays by the caller's settings, not by those the workspace was built for
    texts = [[d.turn_texts for d in play_demonstrations(cfg, workspace(cfg), 60)[1]] for cfg in (a, b)]
    assert texts[0] != texts[1]
    assert workspace(c).env is not workspace(a).env and workspace(c).env.settings.top_k == 2


# ----------------------------------------------------------------------------- registry, report


def test_promotion_needs_a_win_beyond_the_margin():
    assert compare("2", {"greedy/em": 0.5}, None, None, "greedy/em", 0.1).promoted
    assert compare("2", {"greedy/em": 0.55}, "1", {"greedy/em": 0.5}, "greedy/em", 0.02).promoted
    kept = compare("2", {"greedy/em": 0.51}, "1", {"greedy/em": 0.5}, "greedy/em", 0.02)
    assert not kept.promoted and kept.champion_after == "1" and "does not beat" in kept.reason
    # a NaN (a plug-in's metric) is never promoted, and a NaN champion does not hold the alias forever
    nan = float("nan")
    assert not compare("2", {"greedy/em": nan}, None, None, "greedy/em", 0.0).promoted
    refused = compare("2", {"greedy/em": nan}, "1", {"greedy/em": 0.5}, "greedy/em", 0.0)
    assert not refused.promoted and refused.champion_after == "1" and "not a finite score" in refused.reason
    assert compare("2", {"greedy/em": 0.1}, "1", {"greedy/em": nan}, "greedy/em", 0.02).promoted


def test_model_references():
    assert parse_model_ref("3") == ("agentr1-policy", "3", None)
    assert parse_model_ref("champion") == ("agentr1-policy", None, "champion")
    assert parse_model_ref("models:/m@best") == ("m", None, "best")
    assert parse_model_ref("models:/m/7") == ("m", "7", None)
    # no alias has a '/' or '.': a path that is not there is said to be one, not an unknown alias
    with pytest.raises(NotFound, match="'runs/nope/final': no such directory"):
        parse_model_ref("runs/nope/final")


def test_a_bad_preset_or_override_fails_in_one_line_before_prefect_starts(capsys, monkeypatch):
    import cli.flows

    monkeypatch.setattr(cli.flows, "use_local_server", lambda: pytest.fail("started Prefect's server first"))
    from cli.main import main

    assert main(["pipeline", "--preset", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentr1: error: preset 'nope': no such config file; presets: [") and "\n" not in err
    assert main(["pipeline", "--preset", "quick", "-o", "ppo.lr=-1"]) == 2
    assert "ppo.lr" in capsys.readouterr().err


def test_metrics_table_rows_and_gain():
    table = metrics_table({"warm-up": {"greedy/em": 0.25}, "final": {"greedy/em": 0.75, "sampled/em": 0.5}})
    assert "| greedy/em | 0.250 | 0.750 | 0.500 |" in table
    assert "| sampled/em |  | 0.500 |  |" in table and "greedy/f1" not in table


# ----------------------------------------------------------------------------- deployments


def test_prefect_yaml_declares_the_deployments_with_valid_forms():
    from flows.serve import deployment_specs, to_deployment

    specs = {s["name"]: s for s in deployment_specs()}
    assert {"manual", "nightly", "on-demand", "mask-and-reward", "default"} <= set(specs)
    forms = {"pipeline": PipelineParams, "retrain": RetrainParams, "evaluate": EvaluateParams,
             "ablation": AblationParams, "suite": SuiteParams}
    for spec in specs.values():
        dep = to_deployment(spec)
        forms[dep.flow_name](**dep.parameters["params"])  # the defaults validate
    nightly = to_deployment(specs["nightly"])
    assert nightly.flow_name == "retrain" and nightly.schedules[0].schedule.cron == "0 3 * * *"
    assert not to_deployment(specs["manual"]).schedules


@pytest.mark.slow
def test_served_deployment_runs_with_the_form_defaults(prefect_api, data_dir, warm_dir, tmp_path, monkeypatch):
    """Deploy the pipeline with tiny defaults, create a run as the UI's Run button does (no
    parameters given), and let a Runner execute it (from a seeded warm-up, to save time)."""
    # One torch thread in the flow's subprocess and in this process, whatever earlier tests set
    # here: sums over a different number of threads round differently, and the end of this test
    # compares the two runs' weights bit for bit.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from prefect import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.runner import Runner

    from flows.serve import deployment_specs, to_deployment

    spec = next(s for s in deployment_specs() if s["name"] == "manual")
    same = ("ppo.iterations=2", "rollout.backend=hf", "ppo.trace_episodes=2")  # hf: one backend in both processes
    defaults = {"params": form(data_dir, seeded_run(tmp_path, warm_dir), *same).model_dump(mode="json")}
    deployment = to_deployment(spec, parameters=defaults)

    async def run() -> object:
        runner = Runner(name="test-runner", query_seconds=1)
        await runner.aadd_deployment(deployment)
        created = await run_deployment(f"pipeline/{spec['name']}", timeout=0)
        await asyncio.wait_for(runner.start(run_once=True), FLOW_RUN_TIMEOUT_S)
        async with get_client() as client:
            schema = (await client.read_deployment_by_name(f"pipeline/{spec['name']}")).parameter_openapi_schema
            return await client.read_flow_run(created.id), schema

    flow_run, schema = asyncio.run(run())
    assert flow_run.state.type == StateType.COMPLETED, flow_run.state
    assert flow_run.parameters == defaults
    assert {"preset", "overrides", "margin", "ppo_iterations"} <= set(schema["definitions"]["PipelineParams"]["properties"])

    arts = artifacts_of(flow_run.id)
    assert float(arts["pipeline-ppo-progress"]) == pytest.approx(100.0)
    assert "greedy/em" in arts["pipeline-summary"] and "/#/experiments/" in arts["pipeline-summary"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["promotion"]["champion_after"] is not None
    assert sorted(p.name for p in (tmp_path / "run" / "rollouts").iterdir()) == ["iter-0001.parquet",
                                                                               "iter-0002.parquet"]
    tags = tracking.client().get_run(summary["run_id"]).data.tags
    assert tags["prefect_flow_run_id"] == str(flow_run.id)
    # Episodes as MLflow traces of the run: each evaluated greedy episode (eval.max_examples=4),
    # and ppo.trace_episodes of each PPO batch.
    import mlflow

    from adapters import traces

    experiment = tracking.client().get_run(summary["run_id"]).info.experiment_id
    found = mlflow.search_traces(locations=[experiment], run_id=summary["run_id"], return_type="list")
    kinds = [(t.info.tags.get(traces.TAG_KIND), t.info.tags.get(traces.TAG_EVAL) or t.info.tags.get(traces.TAG_ITERATION))
             for t in found]
    # final/ is the warm-up when the dev check kept iteration 0: its evaluation was the warm-up's
    # (the same weights on the same questions are played once), traced under "warmup".
    played = "warmup" if summary["selected"]["iteration"] == 0 else "final"
    assert kinds.count(("evaluation", played)) == 4 and kinds.count(("evaluation", "final")) == 4 * (played == "final")
    assert kinds.count(("ppo", "1")) == kinds.count(("ppo", "2")) == 2
    assert all(any(s.span_type == "LLM" for s in t.data.spans) for t in found)

    # One PPO loop: `agentr1 train` (the CLI and DVC path) on the same config and warm-up ends
    # on bit-identical parameters.
    from safetensors.torch import load_file

    from agentr1.recipe.stages import train

    cli_run = seeded_run(tmp_path / "cli", warm_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(resolve_config(form(data_dir, cli_run, *same), "pipeline"), stages=("ppo",))
    finally:
        torch.set_num_threads(threads)
    flow_w, cli_w = (load_file(d / "final" / "model.safetensors") for d in (tmp_path / "run", cli_run))
    assert flow_w.keys() == cli_w.keys() and all(torch.equal(flow_w[k], cli_w[k]) for k in flow_w)
    assert tags[tracking.TAG_DATA_HASH] == summary["data"]["md5"]
    assert tags[tracking.TAG_CONFIG_HASH] and tags[tracking.TAG_ROLLOUT_VERSION]


# ----------------------------------------------------------------------------- failures


def _corrupt(path: Path, line: int, edit) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    edit(rows, line)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


FAULTS = {
    "no_answers": ("train", "answers", lambda rows, i: rows[i].update(answers=[])),
    "empty_question": ("dev", "question", lambda rows, i: rows[i].update(question="")),
    "missing_support": ("test", "supporting_docs", lambda rows, i: rows[i].update(supporting_docs=["no-such-doc"])),
    "duplicate_ids": ("train", "id", lambda rows, i: rows[i].update(id=rows[0]["id"])),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_corrupt_data_fails_the_flow_with_a_report_and_changes_nothing(fault, prefect_api, data_dir, tmp_path):
    from flows.pipeline import pipeline

    split, field, edit = FAULTS[fault]
    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    _corrupt(bad / "qa" / f"{split}.jsonl", 2, edit)
    before = registry_state()
    error, flow_run_id = run_failing(pipeline, form(bad, tmp_path / "run"))
    assert type(error).__name__ == "ValidationFailed"
    report = artifacts_of(flow_run_id)["data-validation-report"]
    assert f"field `{field}`" in report and f"{split}.jsonl:3" in report
    assert not (tmp_path / "run").exists(), "nothing may be written for a rejected dataset"
    assert registry_state() == before


@pytest.mark.slow
def test_corrupted_rollout_batch_stops_before_the_update(prefect_api, data_dir, warm_dir, tmp_path, monkeypatch):
    from flows.pipeline import pipeline

    collect = PPOSession.collect

    def corrupted(self):
        trajs = collect(self)
        trajs[1].outcome_reward = float("nan")
        trajs[2].action_mask = trajs[2].action_mask[:-1]
        return trajs

    monkeypatch.setattr(PPOSession, "collect", corrupted)
    run = seeded_run(tmp_path, warm_dir)
    before = registry_state()
    error, flow_run_id = run_failing(pipeline, form(data_dir, run))
    assert type(error).__name__ == "ValidationFailed"
    report = artifacts_of(flow_run_id)["rollout-validation-report"]
    assert "outcome_reward" in report and "action_mask" in report and "iter-0001.parquet row 1" in report
    # No PPO checkpoint and no final policy; only the warm-up's dev score, as the best so far.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best"] and not (run / "final").exists()
    assert json.loads((run / "checkpoints/best/best.json").read_text())["iteration"] == 0
    assert registry_state() == before


@pytest.mark.slow
def test_the_pipeline_checkpoints_on_the_configs_schedule(prefect_api, data_dir, warm_dir, tmp_path, monkeypatch):
    """Under Prefect the PPO iterations are the engine's one loop (recipe.ppo.run_ppo): a checkpoint
    every ppo.checkpoint_every iterations and at the end, each batch stored and validated first."""
    from flows.pipeline import pipeline

    saved: list[int] = []
    save = PPOSession.save

    def recording(self):
        saved.append(self.iteration)
        return save(self)

    monkeypatch.setattr(PPOSession, "save", recording)
    run = seeded_run(tmp_path, warm_dir)
    result = pipeline(form(data_dir, run, "ppo.iterations=5", "ppo.checkpoint_every=2"))
    assert saved == [2, 4, 5] and result["iterations"] == 5
    assert sorted(p.name for p in (run / "rollouts").glob("*.parquet")) == [f"iter-000{i}.parquet" for i in range(1, 6)]


# ----------------------------------------------------------------------------- retrain, evaluate


@pytest.mark.slow
def test_retrain_keeps_the_champion_when_the_challenger_is_not_better(prefect_api, data_dir, warm_dir, champion,
                                                                     tmp_path):
    from flows.retrain import retrain

    versions, current = registry_state()
    # EM lies in [0, 1]: no challenger can beat the champion by more than 1.
    result = retrain(form(data_dir, seeded_run(tmp_path, warm_dir), cls=RetrainParams, margin=1.0))
    assert not result["promotion"]["promoted"]
    assert registry_state() == (sorted([*versions, result["registered_version"]]), current)
    assert result["promotion"]["champion_score"] is not None, "the champion was evaluated again"


@pytest.mark.slow
def test_retrain_promotes_a_better_challenger(prefect_api, data_dir, warm_dir, champion, tmp_path):
    from flows.retrain import retrain

    _, current = registry_state()
    # A margin of -1 counts any challenger as better: promotion itself is what is tested.
    result = retrain(form(data_dir, seeded_run(tmp_path, warm_dir), cls=RetrainParams, margin=-1.0))
    assert result["promotion"]["promoted"] and result["promotion"]["champion_before"] == current
    assert registry_state()[1] == result["registered_version"] != current
    tags = tracking.client().get_run(result["run_id"]).data.tags
    assert tags["champion_version"] == result["promotion"]["champion_after"] == registry_state()[1]
    experiment = tracking.client().get_run(result["run_id"]).info.experiment_id
    assert tracking.client().get_experiment(experiment).name == "agentr1-retrain"


@pytest.mark.slow
def test_evaluate_flow_on_the_registered_champion(prefect_api, data_dir, champion, tmp_path):
    from flows.evaluate import evaluate

    params = EvaluateParams(model="champion", split="dev", output_dir=str(tmp_path / "eval"),
                            overrides=[f"data.dir={data_dir}", *TINY, *FAST])
    result = evaluate(params)
    assert result["label"] == f"v{registry_state()[1]}" and 0.0 <= result["metrics"]["greedy/em"] <= 1.0
    assert result["metrics"]["greedy/n"] == 4  # the whole dev split of the tiny world
    run = tracking.client().get_run(result["run_id"])
    assert f"eval/v{registry_state()[1]}/greedy/em" in run.data.metrics
    # a directory of the user's that holds an evaluation is not written into
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "eval_checkpoint.json").write_text("mine")
    with pytest.raises(ConfigError, match="was not made by agentr1"):
        evaluate(params.model_copy(update={"output_dir": str(foreign)}))
    assert [p.name for p in foreign.iterdir()] == ["eval_checkpoint.json"]
    assert (foreign / "eval_checkpoint.json").read_text() == "mine"


@pytest.mark.slow
def test_cli_runs_a_flow_and_says_where_to_look(prefect_api, data_dir, champion, tmp_path, capsys, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    from cli.main import main

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # never a server someone runs here
    overrides = [x for o in [f"data.dir={data_dir}", *TINY, *FAST] for x in ("-o", o)]
    assert main(["pipeline", "--flow", "evaluate", "--split", "dev", "--output-dir", str(tmp_path / "e"),
                 *overrides]) == 0
    out = capsys.readouterr().out
    assert f"champion (v{registry_state()[1]}) on dev: exact match greedy" in out
    assert "Run directory : " + str(tmp_path / "e") in out and "/#/experiments/" in out
    assert "/runs/flow-run/" in out
    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    _corrupt(bad / "qa" / "dev.jsonl", 0, FAULTS["empty_question"][2])
    assert main(["pipeline", "--output-dir", str(tmp_path / "p"), *overrides, "-o", f"data.dir={bad}"]) == 2
    assert "validation failed" in capsys.readouterr().err


def test_no_form_description_holds_a_placeholder_the_ui_would_eat():
    """Prefect's form renders field descriptions as markdown, which takes <flow>, <name>... for
    HTML tags and shows "runs//." (issue 49): every deployed flow's descriptions say it in words."""
    import re

    from prefect.utilities.callables import parameter_schema

    from flows.ablation import ablation
    from flows.evaluate import evaluate
    from flows.pipeline import pipeline
    from flows.retrain import retrain
    from flows.suite import suite

    def descriptions(node) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "description" and isinstance(v, str)] + \
                [d for k, v in node.items() if k != "description" for d in descriptions(v)]
        return [d for v in node for d in descriptions(v)] if isinstance(node, list) else []

    for flow in (pipeline, retrain, evaluate, ablation, suite):
        texts = descriptions(parameter_schema(flow.fn).model_dump())
        assert texts, flow.name
        assert not [t for t in texts if re.search(r"<[^<>]*>", t)], flow.name
