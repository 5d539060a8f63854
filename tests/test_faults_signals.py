"""Fault injection by signal: SIGTERM to `agentr1 pipeline` at each stage and to `agentr1 ablate`
(gone within a bound, every child stopped, runs ended KILLED/Crashed, the rerun finishes), and
what a kill -9 of a flow leaves behind, repaired at the next start. Each case states what must
survive. (A file of its own so that `make test`'s two workers share the slow cases out; the
stops of a whole process group, an ablation and `agentr1 serve` are in test_faults_stops.py.)"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults_registry import finish, read_until
from test_faults_training import data_dir  # noqa: F401  (a fixture: the tiny data set)
from test_sandbox import _sha_tree
from test_trainer import TINY


REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- SIGTERM to `agentr1 pipeline`

# A stage, as the log line after which the pipeline is in it (the tiny run's stages last a second
# or a few: the data checks ~10 s, the final evaluation and the registration ~2 s each).
STAGES = {"data": "data: making", "warm-up": "warm-up: playing", "ppo": "iter   1/",
          "evaluation": "Task run 'save-final-policy", "registration": "Task run 'evaluate-final'"}
RERUN = {"warm-up", "ppo", "registration"}  # the others would only repeat what the rerun of these shows
STOP_WITHIN_S = 30  # a liveness bound: measured 1-2 s on an idle machine (docs/operations.md)


def _pipeline_cmd(data_dir, out, *extra) -> list[str]:
    from test_flows import FAST

    o = [f"data.dir={data_dir}", *TINY, *FAST, "ppo.iterations=3", "rollout.backend=hf", *extra]
    return [sys.executable, "-m", "cli", "pipeline", "--output-dir", str(out), *[x for i in o for x in ("-o", i)]]


def _registered_models_load(tracking_uri: str) -> list[str]:
    """Every registered version of the store, each checked to be a whole MLflow model (its
    MLmodel file and weights download): a stop inside the registration must not leave a version
    that points at half a model."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    versions = []
    for mv in client.search_model_versions():
        uri = client.get_model_version_download_uri(mv.name, mv.version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, tracking_uri=tracking_uri))
        assert (local / "MLmodel").is_file() and list(local.rglob("model.safetensors")), (mv.version, local)
        versions.append(mv.version)
    return versions


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_sigterm_at_a_stage_ends_the_runs_and_every_child_and_the_rerun_finishes(stage, data_dir, prefect_api,
                                                                                tmp_path):
    """SIGTERM to `agentr1 pipeline` at a stage: the process is gone soon with exit status 143 and
    one line, no process it started is left (Prefect's temporary server, tool workers), its MLflow
    run is KILLED, its Prefect flow run Crashed (not Running), the data set is as it was and no
    registered version is half a model; stopped in the warm-up, PPO or the registration, the same
    command then finishes, reusing the warm-up if it was whole. (That PPO resumed from a checkpoint
    ends with the weights of a run never stopped is the kill -9 case's, test_faults_training.py.)"""
    import psutil

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PREFECT_HOME": str(tmp_path / "prefect"),
           "MLFLOW_TRACKING_URI": store}
    env.pop("PREFECT_API_URL", None)  # the command's own temporary server, whose end is part of the test
    out, data_before = tmp_path / "run", _sha_tree(data_dir)
    proc = subprocess.Popen(_pipeline_cmd(data_dir, out), cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    seen = read_until(proc, STAGES[stage], timeout_s=300)
    assert proc.poll() is None, "".join(seen[-20:])
    family = psutil.Process(proc.pid).children(recursive=True)
    assert family, "the pipeline started no child process (Prefect's server): the check below would prove nothing"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, rest, _ = finish(proc, timeout_s=120)  # a hang fails with the process's stacks
    took = time.monotonic() - start
    assert proc.returncode == 128 + signal.SIGTERM, rest[-3000:]
    assert took < STOP_WITHIN_S, took
    said = [line for line in rest.splitlines() if line.startswith("agentr1: ")]
    assert said == [said[0]] and said[0].startswith("agentr1: stopped by SIGTERM"), rest[-3000:]
    alive = [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left running: {alive}"
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("select status from runs").fetchall() == [("KILLED",)]
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        assert db.execute("select state_type from flow_run").fetchall() == [("CRASHED",)]
    assert _sha_tree(data_dir) == data_before
    registered = _registered_models_load(store)
    print(f"\nSIGTERM at {stage}: gone in {took:.1f} s; registered versions: {registered}")
    if stage not in RERUN:
        return
    # The rerun talks to the suite's Prefect server: a temporary server of its own would cost
    # ~15 s and prove nothing here.
    from prefect.settings import PREFECT_API_URL

    env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    done = subprocess.run(_pipeline_cmd(data_dir, out), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # the warm-up again, or PPO from its last checkpoint, and on to the end
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "final" / "model.safetensors").is_file()
    assert len(_registered_models_load(store)) == len(registered) + 1, done.stdout[-2000:]
    # Stopped in the warm-up, the rerun warms up again; stopped later, it reuses the warm-up.
    assert ("reusing the warm-up checkpoint" in done.stdout + done.stderr) == (stage != "warm-up"), done.stderr[-3000:]


# ----------------------------------------------------------------------------- leftovers of a kill -9

DOOMED_FLOW = """
import time
from prefect import flow
from prefect.runtime import flow_run
from adapters import lifecycle, tracking

@flow(name="pipeline")
def doomed():
    with lifecycle.start_run(tracking.EXPERIMENTS["pipeline"], "doomed",
                            tags={tracking.TAG_PREFECT_FLOW_RUN: flow_run.get_id()}) as run_id:
        print("IDS", run_id, flow_run.get_id(), flush=True)
        time.sleep(600)

doomed()
"""


@pytest.mark.slow
def test_a_killed_flow_runs_mlflow_and_prefect_runs_are_ended_at_the_next_start(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.pipeline import crash_orphaned_flow_runs
    from adapters import lifecycle, tracking

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen([sys.executable, "-c", DOOMED_FLOW], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = next(line for line in proc.stdout if line.startswith("IDS "))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _, run_id, flow_run_id = line.split()
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.is_running()  # what kill -9 leaves behind
    assert tracking.client().get_run(run_id).info.status == "RUNNING"

    # The next start of a flow of that kind: its start_run sweeps MLflow, then Prefect.
    with lifecycle.start_run(tracking.EXPERIMENTS["pipeline"], "next"):
        assert flow_run_id in crash_orphaned_flow_runs(tracking.EXPERIMENTS["pipeline"])
    assert tracking.client().get_run(run_id).info.status == "KILLED"
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.is_crashed()
    assert crash_orphaned_flow_runs(tracking.EXPERIMENTS["pipeline"]) == []  # once only


def test_a_stop_that_another_handler_swallowed_is_still_a_stop():
    """While a task starts, Prefect's own SIGTERM handler is the one installed; it can lose the
    signal (the task fails with ValueError('Task run is not set')) and never call ours. run_flow
    reads what arrived from the interpreter's wakeup fd, so the command still stops as stopped."""
    import argparse
    import types

    from cli.flows import Stopped, run_flow

    def flow(params, return_state):
        swallow = signal.signal(signal.SIGTERM, lambda *a: None)  # as Prefect's bridge does, in effect
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        finally:
            signal.signal(signal.SIGTERM, swallow)
        raise ValueError("Task run is not set")

    with pytest.raises(Stopped) as stopped:
        run_flow(argparse.Namespace(json=False), flow, None)
    assert stopped.value.signum == signal.SIGTERM and isinstance(stopped.value.__cause__, ValueError)

    def quiet(params, return_state):  # no signal: the flow's own outcome, untouched
        return types.SimpleNamespace(is_crashed=lambda: False)

    assert run_flow(argparse.Namespace(json=False), quiet, None).is_crashed() is False
