"""The ablation: variants, seed statistics, the efficiency ratio, naive RAG, resuming, and the
flow end to end (process workers, nested MLflow runs, a re-run that reuses finished runs)."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from test_trainer import TINY

from agentr1.ablation import (
    FULL,
    VANILLA,
    VARIANTS,
    CurveSettings,
    claim,
    efficiency,
    efficiency_markdown,
    efficiency_table,
    eval_iterations,
    mean_curve,
    mean_std,
    plan_jobs,
    results_csv,
    results_markdown,
    run_job,
    summarize,
)
from agentr1.config import ConfigError, load_config
from adapters import tracking
from flows.forms import AblationParams
from tasks.ablation import ABLATION_CONF, RunnerSettings, base_config, load_spec, plan, task_runner
from agentr1.presets import REPO_ROOT, preset_path

# A tiny ablation: two RL variants and a baseline, two seeds, 2 PPO iterations, short episodes.
TINY_ABLATION = [*TINY, "ppo.iterations=2", "eval.max_examples=4", "env.max_turns=2", "env.max_turn_tokens=8",
                 "seeds=[0,1]", f"variants=[{FULL},{VANILLA},naive-rag]", "curve.every=1", "curve.max_examples=2",
                 "runner.max_workers=2"]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Runs in this process use one thread, as each process worker does: on a busy machine two
    spinning intra-op threads can make a tiny model's forward passes 100x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def switches(cfg) -> tuple:
    return cfg.ppo.estimator, cfg.ppo.loss_mask, cfg.ppo.advantage_mask, cfg.reward.process_enabled, cfg.ppo.group_size


# ----------------------------------------------------------------------------- variants and spec


def test_variants_differ_only_in_their_switches_and_share_the_budget(tmp_path):
    spec = load_spec("quick", ["seeds=[0,1]", "group_size=4"], output_dir=str(tmp_path))
    jobs = plan(spec, base_config(spec))
    rl_first = [j.kind == "rl" for j in jobs]
    assert len(jobs) == 2 * len(VARIANTS) and rl_first == sorted(rl_first, reverse=True), "long runs start first"
    by = {(j.variant, j.seed): j.cfg for j in jobs}
    expected = {
        "ppo": ("gae", True, True, True, 1), "ppo-no-adv-mask": ("gae", True, False, True, 1),
        "ppo-no-masks": ("gae", False, False, True, 1), "ppo-outcome-only": ("gae", True, True, False, 1),
        "ppo-step-gae": ("step_gae", True, True, True, 1),
        "ppo-vanilla": ("gae", False, False, False, 1), "grpo": ("grpo", True, True, True, 4),
        "grpo-no-loss-mask": ("grpo", False, True, True, 4), "reinforce-pp": ("reinforce_pp", True, True, True, 1),
        "rloo": ("rloo", True, True, True, 4), "gigpo": ("gigpo", True, True, True, 4),
    }
    for name, want in expected.items():
        assert switches(by[name, 0]) == switches(by[name, 1]) == want, name
    assert len(set(expected.values())) == len(expected), "two RL variants would be the same experiment"
    rl = [j.cfg for j in jobs if j.kind == "rl"]
    assert {(c.ppo.iterations, c.ppo.episodes_per_iter, c.ppo.lr, c.sft.steps) for c in rl} == {
        (4, 8, 1e-4, 60)}, "every variant gets the same budget"
    assert len({j.cfg.output_dir for j in jobs}) == len(jobs)
    assert {j.cfg.seed for j in jobs} == {0, 1}
    # Everything else is the base config.
    base = base_config(spec).model_dump()
    for j in jobs:
        d = j.cfg.model_dump()
        assert {k for k in d if d[k] != base[k]} <= {"seed", "output_dir", "ppo", "reward"}
        assert d["env"] == base["env"] and d["model"] == base["model"]


def test_overrides_go_to_the_spec_or_to_the_training_config(tmp_path, registry_restored):
    spec = load_spec("quick", ["seeds=[3,4,5]", "runner.max_workers=1", "ppo.iterations=7", "data.dir=elsewhere"],
                     output_dir=str(tmp_path))
    assert spec.seeds == [3, 4, 5] and spec.runner.max_workers == 1 and spec.output_dir == str(tmp_path)
    cfg = base_config(spec)
    assert cfg.ppo.iterations == 7 and cfg.data.dir == "elsewhere" and cfg.output_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="variants"):
        load_spec("quick", ["variants=[ppo,no-such-variant]"])
    with pytest.raises(ConfigError, match="seeds"):
        load_spec("quick", ["seeds=[1,1]"])
    with pytest.raises(ConfigError, match="ppo.lr"):
        base_config(load_spec("quick", ["ppo.lr=-1"]))
    with pytest.raises(FileNotFoundError, match="quick"):
        load_spec("nope")
    for path in sorted((REPO_ROOT / ABLATION_CONF).glob("*.yaml")):  # every shipped preset plans
        spec = load_spec(path.stem)
        jobs = plan(spec, base_config(spec))
        assert len(jobs) == len(spec.variants) * len(spec.seeds)
        assert spec.policy == "last" and {j.cfg.ppo.dev_every for j in jobs} == {0}, path  # what each variant learned
    recipe = base_config(load_spec("quick", ["policy=recipe"]))  # the preset's own selection, as `train` runs it
    assert recipe.ppo.dev_every == load_config(preset_path("quick")).ppo.dev_every > 0


def test_task_runner_kinds():
    from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

    assert RunnerSettings().kind == "process"
    assert RunnerSettings(max_workers=2).resolved(cores=8) == (2, 4)
    assert RunnerSettings(threads_per_worker=2).resolved(cores=8) == (4, 2)
    assert RunnerSettings(kind="sequential").resolved(cores=8) == (1, 8)
    runner = task_runner(RunnerSettings(max_workers=3))
    assert isinstance(runner, ProcessPoolTaskRunner) and runner._max_workers == 3
    assert isinstance(task_runner(RunnerSettings(kind="sequential")), ThreadPoolTaskRunner)
    with pytest.raises(ConfigError, match=r"runner.kind: .*'ray' is no longer.*\['process', 'sequential', 'dask'\]"):
        load_spec("quick", ["runner.kind=ray"])


def test_dask_task_runner():
    # the `dask` extra, which `make setup` installs (`EXTRAS=dev` leaves it out)
    DaskTaskRunner = pytest.importorskip("prefect_dask").DaskTaskRunner

    dask = task_runner(RunnerSettings(kind="dask", address="tcp://127.0.0.1:8786"))
    assert isinstance(dask, DaskTaskRunner) and dask.address == "tcp://127.0.0.1:8786" and not dask.cluster_kwargs
    local = task_runner(RunnerSettings(kind="dask", max_workers=2))
    assert local.address is None and local.cluster_kwargs["n_workers"] == 2


def test_a_run_directory_refuses_another_config(tmp_path):
    claim(tmp_path / "job.json", {"config_hash": "a", "seed": 0})
    claim(tmp_path / "job.json", {"config_hash": "a", "seed": 0})  # the same: resuming is fine
    with pytest.raises(ConfigError, match="config_hash"):
        claim(tmp_path / "job.json", {"config_hash": "b", "seed": 0})


# ----------------------------------------------------------------------------- statistics


def result(variant: str, seed: int, em: float, curve: list[tuple[int, float, float]] = ()) -> dict:
    return {"variant": variant, "seed": seed, "kind": VARIANTS[variant].kind, "train_seconds": 10.0 * (seed + 1),
            "final": {"greedy/em": em, "greedy/f1": em, "sampled/em": em / 2, "sampled/f1": 0.0},
            "curve": [{"iteration": i, "train_seconds": s, "greedy/em": e, "greedy/f1": e, "sampled/em": e,
                       "sampled/f1": e} for i, s, e in curve]}


def test_mean_and_std_over_seeds_in_the_table():
    m, s = mean_std([0.2, 0.4])
    assert m == pytest.approx(0.3) and s == pytest.approx(math.sqrt(0.02))  # sample std (n - 1)
    assert math.isnan(mean_std([0.5])[1]) and math.isnan(mean_std([])[0])
    rows = summarize([result("ppo-vanilla", 0, 0.5), result("ppo", 1, 0.4), result("ppo", 0, 0.2)])
    assert [r.variant for r in rows] == ["ppo", "ppo-vanilla"], "rows follow VARIANTS, not arrival order"
    assert rows[0].seeds == 2 and rows[0].stats["greedy/em"][0] == pytest.approx(0.3)
    assert rows[0].train_seconds == pytest.approx(15.0)
    table = results_markdown(rows)
    assert "| 2 | 0.300 ± 0.141 | 0.300 ± 0.141 | 0.150 ± 0.071 | 0.000 ± 0.000 | 15 |" in table
    assert "| 1 | 0.500 | 0.500 | 0.250 |" in table, "one seed: no std to show"
    parsed = list(csv.DictReader(io.StringIO(results_csv(rows))))
    assert parsed[1]["label"] == VARIANTS[VANILLA].label and parsed[1]["greedy/em_std"] == "nan"
    assert float(parsed[0]["greedy/em_mean"]) == pytest.approx(0.3)


def test_seed_curves_are_averaged_per_iteration():
    curve = mean_curve([result("ppo", 0, 0, [(0, 0.0, 0.0), (2, 4.0, 0.5)]),
                        result("ppo", 1, 0, [(0, 0.0, 0.0), (2, 6.0, 0.25)])])
    assert [p["iteration"] for p in curve] == [0, 2]
    assert curve[1]["greedy/em"] == pytest.approx(0.375) and curve[1]["train_seconds"] == pytest.approx(5.0)
    assert curve[1]["greedy/em/std"] == pytest.approx(math.sqrt(2 * 0.125 ** 2))


def mean_points(points: list[tuple[int, float, float]]) -> list[dict]:
    return [{"iteration": i, "train_seconds": s, "greedy/em": e} for i, s, e in points]


def test_efficiency_ratio_reached_never_reached_no_gain_missing():
    vanilla = mean_points([(0, 0, 0.1), (2, 10, 0.2), (4, 20, 0.3), (6, 30, 0.3), (8, 40, 0.3)])
    fast = mean_points([(0, 0, 0.1), (2, 12, 0.35), (4, 24, 0.2), (8, 48, 0.5)])
    eff = efficiency({FULL: fast, VANILLA: vanilla})
    assert eff.status == "reached" and eff.target == pytest.approx(0.3)
    assert (eff.full_iterations, eff.reference_iterations) == (2, 4), "the first time each curve gets there"
    assert eff.iteration_ratio == pytest.approx(0.5) and eff.time_ratio == pytest.approx(12 / 20)
    assert "iteration ratio 0.50" in eff.sentence() and "wall-time ratio 0.60" in eff.sentence()

    slow = mean_points([(0, 0, 0.1), (4, 20, 0.2), (8, 40, 0.29)])
    never = efficiency({FULL: slow, VANILLA: vanilla})
    assert never.status == "never_reached" and never.iteration_ratio is None and never.time_ratio is None
    assert "never reached" in never.sentence() and "8 iterations" in never.sentence()

    flat = mean_points([(0, 0, 0.2), (8, 40, 0.2)])
    assert efficiency({FULL: fast, VANILLA: flat}).status == "no_gain"
    assert "not defined" in efficiency({FULL: fast, VANILLA: flat}).sentence()
    assert efficiency({FULL: fast}).status == "missing"
    assert json.loads(json.dumps(eff.to_dict()))["iteration_ratio"] == 0.5


def test_efficiency_table_compares_the_full_method_with_every_other_variant():
    start = (0, 0, 0.4)
    curves = {FULL: mean_points([start, (5, 30, 0.6), (10, 60, 0.7)]),
              VANILLA: mean_points([start, (5, 30, 0.3), (10, 60, 0.25)]),
              "ppo-outcome-only": mean_points([start, (5, 31, 0.45), (10, 62, 0.55)]),
              "reinforce-pp": mean_points([start, (5, 29, 0.5), (10, 58, 0.75)])}
    table = {e.reference: e for e in efficiency_table(curves)}
    assert set(table) == {VANILLA, "ppo-outcome-only", "reinforce-pp"}
    assert table[VANILLA].status == "no_gain" and table[VANILLA] == efficiency(curves)
    outcome = table["ppo-outcome-only"]
    assert (outcome.status, outcome.full_iterations, outcome.reference_iterations) == ("reached", 5, 10)
    assert outcome.iteration_ratio == pytest.approx(0.5) and outcome.time_ratio == pytest.approx(30 / 62)
    assert "`ppo-outcome-only`'s final greedy/em (0.550)" in outcome.sentence()
    assert table["reinforce-pp"].status == "never_reached"
    text = efficiency_markdown(list(table.values()), "dev")
    assert "| `ppo-vanilla` | 0.250 | no gain over the warm-up |" in text
    assert "| `ppo-outcome-only` | 0.550 | iteration 5 (30 s) | iteration 10 (62 s) | 0.50 | 0.48 |" in text
    assert "| `reinforce-pp` | 0.750 | never (in 10 iterations) |" in text


def test_curve_iterations_include_the_start_and_the_end():
    assert eval_iterations(10, 4) == {0, 4, 8, 10}
    assert eval_iterations(10, 0) == {0, 10}
    assert eval_iterations(0, 3) == {0}


# ----------------------------------------------------------------------------- naive RAG


# ----------------------------------------------------------------------------- the flow


@pytest.fixture(scope="module")
def first_run(prefect_api, tmp_path_factory):
    """The tiny ablation run once through the flow (the warm-up trained by the flow)."""
    from flows.ablation import ablation

    root = tmp_path_factory.mktemp("ablation")
    data = root / "data"
    params = AblationParams(preset="quick", overrides=[f"data.dir={data}", *TINY_ABLATION], output_dir=str(root / "out"))
    state = ablation(params, return_state=True)
    return params, state.result(), state.state_details.flow_run_id


def children_of(parent_run_id: str) -> list:
    experiment = tracking.client().get_run(parent_run_id).info.experiment_id
    return tracking.client().search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_run_id}'")


@pytest.mark.slow
def test_flow_writes_the_table_plots_and_nested_runs(first_run):
    from test_flows import artifacts_of

    _, res, flow_run_id = first_run
    root = res["output_dir"]
    text = Path(res["results_md"]).read_text()
    for name in (FULL, VANILLA, "naive-rag"):
        assert f"(`{name}`) | 2 |" in text, name
    assert "**Learning efficiency**" in text and res["efficiency"]["status"] in ("reached", "never_reached", "no_gain")
    for f in ("results.csv", "curves.csv", "curves.png", "efficiency.json"):
        assert (Path(root) / f).stat().st_size > 0, f
    assert {r["status"] for r in res["runs"]} == {"trained"} and len(res["runs"]) == 6
    # The RL runs' curves: iterations 0, 1, 2 on both seeds.
    curves = list(csv.DictReader(io.StringIO(Path(root, "curves.csv").read_text())))
    assert sorted(c["iteration"] for c in curves if c["variant"] == FULL) == ["0", "0", "1", "1", "2", "2"]

    kids = children_of(res["run_id"])
    assert sorted((k.data.tags["ablation.variant"], k.data.tags["ablation.seed"]) for k in kids) == sorted(
        (v, s) for v in (FULL, VANILLA, "naive-rag") for s in ("0", "1"))
    tags = {(k.data.tags["ablation.variant"], k.data.tags["ablation.seed"]): k for k in kids}
    full, vanilla = tags[FULL, "0"], tags[VANILLA, "0"]
    assert (full.data.params["ppo.loss_mask"], vanilla.data.params["ppo.loss_mask"]) == ("True", "False")
    assert (full.data.tags["ablation.process_reward"], vanilla.data.tags["ablation.process_reward"]) == ("True",
                                                                                                         "False")
    assert tags["naive-rag", "1"].data.tags["ablation.estimator"] == "n/a"
    history = tracking.client().get_metric_history(full.info.run_id, "curve/greedy/em")
    assert sorted(m.step for m in history) == [0, 1, 2]
    assert "final/greedy/em" in full.data.metrics and "actor/ref_kl" in full.data.metrics
    parent = tracking.client().get_run(res["run_id"])
    assert f"final/{FULL}/greedy/em" in parent.data.metrics
    assert "| variant | seeds |" in artifacts_of(flow_run_id)["ablation-summary"]
    # Naive RAG really searched the question first.
    question_call = Path(root, "runs/naive-rag/seed-0/trajectories_final.txt").read_text()
    assert '▶ <tool_call>{"name": "search", "arguments": {"query": "' in question_call


@pytest.mark.slow
def test_rerun_reuses_finished_runs_and_resumes_unfinished_ones(first_run, capsys):
    from cli.main import main

    params, res, _ = first_run
    root = Path(res["output_dir"])
    ckpt = root / "runs" / FULL / "seed-0" / "checkpoints" / "last" / "state.json"
    before = ckpt.stat().st_mtime_ns
    # Make one run unfinished again: drop its result, as if the flow had died before the end.
    (root / "runs" / VANILLA / "seed-1" / "result.json").unlink()
    # The sequential runner this time: runs in this process, no workers to start.
    overrides = [x for o in [*params.overrides, "runner.kind=sequential", "runner.threads_per_worker=1"]
                 for x in ("-o", o)]
    assert main(["ablate", "--preset", "quick", "--output-dir", str(root), "--json", *overrides]) == 0
    again = json.loads(capsys.readouterr().out)
    status = {(r["variant"], r["seed"]): r["status"] for r in again["runs"]}
    assert status.pop((VANILLA, 1)) == "resumed" and set(status.values()) == {"reused"}
    assert ckpt.stat().st_mtime_ns == before, "a finished run was trained again"
    kids = children_of(again["run_id"])
    assert len(kids) == 6 and again["run_id"] != res["run_id"]
    assert sum(k.data.tags["ablation.status"] == "reused" for k in kids) == 5
    resumed = next(k for k in kids if k.data.tags["ablation.status"] == "resumed")
    steps = tracking.client().get_metric_history(resumed.info.run_id, "actor/ref_kl")
    assert sorted(m.step for m in steps) == [1, 2], "the earlier attempt's iterations are logged too"


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_checkpoint(first_run, tmp_path):
    from tasks.training import workspace

    params, res, _ = first_run
    spec = load_spec("quick", params.overrides, output_dir=res["output_dir"])
    (job,) = plan_jobs(base_config(spec), tmp_path, [FULL], [0], 2, CurveSettings(every=1, max_examples=2))
    ws = workspace(job.cfg)
    warm = Path(res["output_dir"]) / "warmup"
    assert run_job(job, ws, warm, stop_after=1) is None
    assert json.loads((job.run_dir / "checkpoints/last/state.json").read_text())["iteration"] == 1
    out = run_job(job, ws, warm)
    assert out["status"] == "resumed" and out["iterations"] == 2
    assert [p["iteration"] for p in out["curve"]] == [0, 1, 2]
    assert len((job.run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert run_job(job, ws, warm)["status"] == "reused"
    with pytest.raises(ConfigError, match="another configuration"):
        run_job(job.__class__(job.variant, job.seed, job.cfg, CurveSettings(every=2)), ws, warm)


# ----------------------------------------------------------------------------- a real Dask cluster

# Two of the first run's jobs again, on a Dask cluster, from its warm-up.
DASK_JOBS = [f"variants=[{FULL},{VANILLA}]", "seeds=[0]"]
# What measures time, not learning: it differs between any two runs of the same job.
TIMING_KEYS = ("train_seconds",)
TIMING_PREFIXES = ("perf/", "time/")


def learned(run_dir: Path) -> dict:
    """A finished run's result, per-iteration metrics and final trajectories, timing left out;
    and the config hash, which covers the run's own output dir."""
    result = json.loads((run_dir / "result.json").read_text())
    result.pop("config_hash")
    for point in [result, *result["curve"]]:
        for key in TIMING_KEYS:
            point.pop(key)
    history = [{k: v for k, v in line.items() if not k.startswith(TIMING_PREFIXES)}
               for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]
    return {"result": result, "history": history, "trajectories": (run_dir / "trajectories_final.txt").read_text()}


@pytest.fixture
def environ_restored():
    """``os.environ`` as it was before the test: LocalCluster writes its workers' settings
    (OMP_NUM_THREADS=1, MKL's, OpenBLAS's) into *this* process's environment, and every later
    subprocess of the suite would inherit them (a later test's flow subprocess did, and trained
    with another thread count than the in-process run it is compared with bit for bit)."""
    import os

    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.slow  # ~40 s; test_task_runner_kinds builds the dask runner in no time
def test_a_dask_cluster_runs_the_jobs_as_the_process_runner_did(first_run, tmp_path, environ_restored):
    """runner.kind=dask against a LocalCluster of 2 worker processes (what a remote scheduler
    looks like to the flow: an address): the same jobs give the process runner's results."""
    import os

    from distributed import Client, LocalCluster

    from flows.ablation import ablation

    params, res, _ = first_run
    first_root = Path(res["output_dir"])
    overrides = [*params.overrides, *DASK_JOBS, f"warmup={first_root / 'warmup'}", "runner.kind=dask"]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, \
            Client(cluster.scheduler_address, set_as_default=False) as client:  # not a default the runner would take
        # Spawned workers inherit this process's environment (conftest's temp MLflow and Prefect
        # home); the Prefect API URL reaches them with each task's serialized settings.
        seen = client.run(lambda: (os.environ["MLFLOW_TRACKING_URI"], os.getpid()))
        assert len(seen) == 2 and {uri for uri, _ in seen.values()} == {os.environ["MLFLOW_TRACKING_URI"]}
        assert os.getpid() not in {pid for _, pid in seen.values()}
        out = ablation(AblationParams(preset="quick", output_dir=str(tmp_path / "dask"),
                                      overrides=[*overrides, f"runner.address={cluster.scheduler_address}"]))
        executed = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert sum(executed.values()) == 2, f"the cluster's workers ran {executed}, not the 2 jobs"
    assert sorted((r["variant"], r["status"]) for r in out["runs"]) == [(FULL, "trained"), (VANILLA, "trained")]
    for variant in (FULL, VANILLA):
        on_dask = learned(tmp_path / "dask" / "runs" / variant / "seed-0")
        by_process = learned(first_root / "runs" / variant / "seed-0")
        assert len(on_dask["history"]) == 2 and "▶" in on_dask["trajectories"], "nothing to compare"
        assert on_dask == by_process, variant  # bit for bit: the same seeds, one torch thread each
    # The workers logged into this process's MLflow store, nested under the flow's run.
    assert sorted(k.data.tags["ablation.variant"] for k in children_of(out["run_id"])) == sorted([FULL, VANILLA])
