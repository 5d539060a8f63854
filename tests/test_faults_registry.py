"""Fault injection against tracking and the registry: processes that race on one MLflow store,
promotions that overlap, NaN and diverged policies, runs killed by a signal, and ``--json``
output that must parse. Real processes, real signals, a real SQLite store (a fresh one per
test where the test is about a fresh store). No mocks."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from test_flows import FAST, data_dir, seeded_run, warm_dir  # noqa: F401  (fixtures)
from test_tracking import policy_dir  # noqa: F401  (fixture)
from test_trainer import TINY

from agentr1.config import Config, ModelConfig
from adapters import lifecycle, tracking
from adapters.registry import RegistrationRefused
from tasks.registry import promote_if_better, register_policy

ROOT = Path(__file__).resolve().parents[1]
EXP = "agentr1-test-faults"
METRIC = "greedy/em"
CHILD_TIMEOUT_S = 120
READY_TIMEOUT_S = 90
FLOW_TIMEOUT_S = 600


@pytest.fixture
def new_store(tmp_path, monkeypatch) -> str:
    """A store that does not exist yet, for this test and the processes it starts."""
    uri = f"sqlite:///{tmp_path / 'new-store' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory) -> Path:
    """An empty store's database, made once: MLflow's schema set-up takes seconds."""
    db = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"], saved = f"sqlite:///{db}", os.environ["MLFLOW_TRACKING_URI"]
    try:
        tracking.client()
    finally:
        os.environ["MLFLOW_TRACKING_URI"] = saved
    return db


@pytest.fixture
def fresh_store(empty_db, tmp_path, monkeypatch) -> str:
    """An empty store of this test's own (a copy of ``empty_db``): no runs, no registered model."""
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    shutil.copyfile(empty_db, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    return f"sqlite:///{db}"


DUMP_ON_USR1 = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
"""What ``agentr1`` does at start (cli/main.py), for the bare ``python -c`` children here."""


def spawn(code: str, *args: str) -> subprocess.Popen:
    """``python -c code args`` in the repository, with this test's environment."""
    return subprocess.Popen([sys.executable, "-c", DUMP_ON_USR1 + textwrap.dedent(code), *args], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout_s: float = CHILD_TIMEOUT_S) -> tuple[int, str, str]:
    """The child's exit status, stdout and stderr. One still running after ``timeout_s`` fails
    the test with every thread's stack (SIGUSR1, which it dumps to stderr), then is killed."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        kill_family(proc)
        out, err = proc.communicate(timeout=30)
        said = err if err is not None else out  # stderr, or both where stderr went to stdout
        pytest.fail(f"pid {proc.pid} still running after {timeout_s:.0f} s; its stacks and output:\n{said[-6000:]}")
    return proc.returncode, out, err


def kill_family(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc`` and every process it started (which would keep its pipes open)."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.kill()


def read_until(proc: subprocess.Popen, marker: str, timeout_s: float = CHILD_TIMEOUT_S) -> list[str]:
    """The lines of ``proc``'s stdout up to the first holding ``marker``. A child that has not
    printed it after ``timeout_s`` fails the test with its stacks; one that ended first, with its
    last lines."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            seen.append(line)
            if marker in line:
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found.is_set():
        if proc.poll() is None:  # its stacks come through the reader, then EOF ends it
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            kill_family(proc)
            reader.join(30)
        pytest.fail(f"{marker!r} never printed (exit status {proc.returncode}):\n{''.join(seen[-30:])}")
    return seen


def wait_for(paths: list[Path], procs: list[subprocess.Popen]) -> None:
    """Until every path exists (each child's "ready"), failing early if a child died."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(p.exists() for p in paths):
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, [finish(p) for p in dead]
        assert time.monotonic() < deadline, "children never got ready"
        time.sleep(0.05)


# A child that gets everything slow (imports) done, says it is ready, then waits for "go", so
# that the step under test starts in every child within a few milliseconds.
BARRIER = """
    import sys, time
    from pathlib import Path
    def barrier(ready, go):
        Path(ready).touch()
        while not Path(go).exists():
            time.sleep(0.001)
"""


# ----------------------------------------------------------------------------- the store


@pytest.mark.slow
def test_first_clients_on_a_new_store_do_not_race(new_store, tmp_path):
    """Two processes open a brand-new store at the same instant; without the lock, MLflow's
    schema set-up collides ("table ... already exists", an alembic row mismatch): 3 tries of 3
    failed that way before it."""
    code = BARRIER + """
    from adapters import lifecycle, tracking
    barrier(sys.argv[1], sys.argv[2])
    with lifecycle.start_run("agentr1-test-faults", "first") as run_id:
        print(run_id)
    """
    go = tmp_path / "go"
    procs = [spawn(code, str(tmp_path / f"ready{i}"), str(go)) for i in range(2)]
    wait_for([tmp_path / f"ready{i}" for i in range(2)], procs)
    go.touch()
    results = [finish(p) for p in procs]
    assert [rc for rc, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    runs = {out.strip() for _, out, _ in results}
    assert len(runs) == 2
    assert all(tracking.client().get_run(r).info.status == "FINISHED" for r in runs)


# ----------------------------------------------------------------------------- promotion


def scored_version(score: float, data_hash: str = "d1", split: str = "test", seed: int = 0) -> tuple[str, str]:
    """A finished run that logged ``score`` for its own final policy, and a registered version
    of it: ``(run_id, version)``. (The version's source is a plain directory: promotion reads
    only the registry and the runs.)"""
    c = tracking.client()
    with lifecycle.start_run(EXP, f"challenger-{score}") as run_id:
        tracking.log_params(run_id, {"eval.split": split, "env.max_turns": 2, "seed": seed})
        tracking.set_tags(run_id, {tracking.TAG_DATA_HASH: data_hash})
        tracking.log_metrics(run_id, {f"eval/final/{METRIC}": score}, step=0)
    try:
        c.create_registered_model(tracking.MODEL_NAME)
    except Exception as exc:  # the model exists already
        assert "RESOURCE_ALREADY_EXISTS" in str(getattr(exc, "error_code", exc)), exc
    version = c.create_model_version(tracking.MODEL_NAME, source=str(ROOT), run_id=run_id).version
    return run_id, str(version)


def champion_now() -> str | None:
    found = tracking.champion(tracking.MODEL_NAME)
    return found[0] if found else None


def test_a_champion_that_moved_during_evaluation_is_compared_by_its_logged_score(fresh_store):
    first_run, v1 = scored_version(0.5)
    second_run, v2 = scored_version(0.4)
    first = promote_if_better.fn(v1, {METRIC: 0.5}, None, None, METRIC, 0.0, first_run)
    assert first.promoted and champion_now() == v1
    # v2's run looked when there was no champion; by the time it moves the alias, v1 holds it.
    second = promote_if_better.fn(v2, {METRIC: 0.4}, None, None, METRIC, 0.0, second_run)
    assert not second.promoted and (second.champion_before, second.champion_after) == (v1, v1)
    assert second.champion_score == 0.5 and f"became v{v1}" in second.reason
    assert champion_now() == v1
    tags = tracking.client().get_run(second_run).data.tags
    assert tags["champion_version"] == v1 and tags["promoted"] == "False"


def test_a_moved_champion_measured_differently_is_kept_and_the_reason_says_why(fresh_store):
    first_run, v1 = scored_version(0.1, data_hash="old-data")
    assert promote_if_better.fn(v1, {METRIC: 0.1}, None, None, METRIC, 0.0, first_run).promoted
    run_id, v2 = scored_version(0.9)
    decision = promote_if_better.fn(v2, {METRIC: 0.9}, None, None, METRIC, 0.0, run_id)
    assert not decision.promoted and decision.champion_after == v1 == champion_now()
    assert "another data version" in decision.reason and "kept" in decision.reason

    # the seed sets the sampled evaluation's draws: a champion scored under another one is kept too
    other_run, v3 = scored_version(0.95, data_hash="old-data", seed=1)
    decision = promote_if_better.fn(v3, {METRIC: 0.95}, None, None, METRIC, 0.0, other_run)
    assert not decision.promoted and "other settings (seed)" in decision.reason


def consistent_order(decisions: list[dict], final: str | None) -> bool:
    """Whether the decisions happened one after another in some order: each started from the
    champion the previous one left, the first from none, and the last left ``final``."""
    for order in itertools.permutations(decisions):
        held = None
        for d in order:
            if d["champion_before"] != held:
                break
            held = d["champion_after"]
        else:
            if held == final:
                return True
    return False


@pytest.mark.slow
def test_overlapping_promotions_are_compare_and_set(fresh_store, tmp_path):
    """Two challengers, each believing there is no champion, move the alias at the same
    instant from two processes: the second must see the first's move and decide against it,
    and the better one ends as champion."""
    scores = [0.2, 0.6]
    made = [scored_version(s) for s in scores]
    code = BARRIER + """
    import json
    from dataclasses import asdict
    from tasks.registry import promote_if_better
    run_id, version, score = sys.argv[3], sys.argv[4], float(sys.argv[5])
    barrier(sys.argv[1], sys.argv[2])
    print(json.dumps(asdict(promote_if_better.fn(version, {"greedy/em": score}, None, None, "greedy/em", 0.0,
                                                   run_id))))
    """
    go = tmp_path / "go"
    procs = [spawn(code, str(tmp_path / f"ready{i}"), str(go), run_id, version, str(score))
             for i, ((run_id, version), score) in enumerate(zip(made, scores))]
    wait_for([tmp_path / f"ready{i}" for i in range(len(procs))], procs)
    go.touch()
    results = [finish(p) for p in procs]
    assert [rc for rc, _, _ in results] == [0] * len(procs), [err[-2000:] for _, _, err in results]
    decisions = [json.loads(out) for _, out, _ in results]
    best = made[scores.index(max(scores))][1]
    assert champion_now() == best
    assert consistent_order(decisions, best), decisions
    for (run_id, _), d in zip(made, decisions):
        assert tracking.client().get_run(run_id).data.tags["champion_version"] == d["champion_after"]


# ----------------------------------------------------------------------------- registration


def poisoned(policy: Path, out: Path, file: str) -> Path:
    """A copy of ``policy`` whose first floating tensor in ``file`` holds a NaN."""
    shutil.copytree(policy, out)
    tensors = load_file(str(out / file))
    name = next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(out / file))
    return out


def registered_versions() -> list[str]:
    return [str(v.version) for v in tracking.client().search_model_versions(f"name='{tracking.MODEL_NAME}'")]


@pytest.mark.parametrize("file", ["model.safetensors", "value_head.safetensors"])
def test_a_policy_with_a_nan_weight_is_not_registered(file, fresh_store, policy_dir, tmp_path):  # noqa: F811
    bad = poisoned(policy_dir, tmp_path / "bad", file)
    with lifecycle.start_run(EXP, "nan-policy") as run_id:
        with pytest.raises(RegistrationRefused, match=rf"{file}: .* holds NaN/inf"):
            register_policy.fn(Config(), str(bad), run_id)
    assert registered_versions() == []
    assert not tracking.client().search_logged_models([tracking.experiment_id(EXP)])


def test_a_diverged_run_registers_nothing_and_a_sound_one_does(fresh_store, policy_dir):  # noqa: F811
    with lifecycle.start_run(EXP, "diverged") as run_id:
        lifecycle.mark_diverged(run_id, "PPO iteration 3: 8 non-finite steps in a row")
        with pytest.raises(RegistrationRefused, match="diverged .PPO iteration 3"):
            register_policy.fn(Config(), str(policy_dir), run_id)
    assert registered_versions() == []
    with lifecycle.start_run(EXP, "sound") as run_id:
        assert register_policy.fn(Config(), str(policy_dir), run_id) == "1"
    assert lifecycle.diverged(run_id) is None and registered_versions() == ["1"]


# ----------------------------------------------------------------------------- interrupted runs

# SIGINT as a terminal's Ctrl-C finds it: a test suite started as a background job of a
# non-interactive shell (`cmd &` in a script) hands its children SIGINT ignored, which Python keeps.
SLEEPER = """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from adapters import lifecycle, tracking
    with lifecycle.start_run("agentr1-test-faults", "sleeper") as run_id:
        print(run_id, flush=True)
        time.sleep(600)
"""



@pytest.mark.slow  # ~10 s: three processes that import MLflow
def test_interrupted_runs_end_killed_by_a_handler_or_at_the_next_start(fresh_store):
    """SIGTERM and Ctrl-C: the process ends its own run KILLED. SIGKILL: nothing in the
    process can react, so the run stays RUNNING until the next run in its experiment starts
    and finds its process gone. (The three sleepers start together: imports are the cost.)"""
    procs = {sig: spawn(SLEEPER) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)}
    run_ids = {sig: proc.stdout.readline().strip() for sig, proc in procs.items()}
    assert all(run_ids.values()), [finish(p) for p in procs.values()]
    for sig, proc in procs.items():
        proc.send_signal(sig)
    ended = {sig: finish(proc) for sig, proc in procs.items()}
    assert all(rc != 0 for rc, _, _ in ended.values())
    c = tracking.client()
    for sig in (signal.SIGTERM, signal.SIGINT):
        run = c.get_run(run_ids[sig])
        assert run.info.status == "KILLED", (sig, ended[sig][2][-2000:])
        assert run.data.tags[tracking.TAG_PID] == str(procs[sig].pid)
    killed = run_ids[signal.SIGKILL]
    assert c.get_run(killed).info.status == "RUNNING"
    with lifecycle.start_run(EXP, "alive") as alive_id:  # this process's own open run must survive
        with lifecycle.start_run(EXP, "next"):
            pass
        assert c.get_run(alive_id).info.status == "RUNNING"
    orphan = c.get_run(killed)
    assert orphan.info.status == "KILLED"
    assert f"process {procs[signal.SIGKILL].pid}" in orphan.data.tags[tracking.TAG_ENDED_BY]


# ----------------------------------------------------------------------------- --json


def test_stdout_to_stderr_keeps_every_writer_off_stdout():
    """Writers that ``redirect_stdout`` alone would miss: a log handler bound to the stdout
    object before (as vLLM's is), a raw write to fd 1, and a child process (as DVC's)."""
    code = """
    import json, logging, os, subprocess, sys
    from cli.console import stdout_to_stderr
    logging.getLogger("lib").addHandler(logging.StreamHandler(sys.stdout))
    with stdout_to_stderr():
        print("a print")
        logging.getLogger("lib").warning("a log line")
        os.write(1, b"a raw write\\n")
        subprocess.run(["echo", "a child"], check=True)
    print(json.dumps({"ok": 1}))
    """
    rc, out, err = finish(spawn(code))
    assert rc == 0, err
    assert json.loads(out) == {"ok": 1}
    assert all(s in err for s in ("a print", "a log line", "a raw write", "a child"))


@pytest.mark.slow
def test_evaluate_json_with_vllm_prints_only_json(data_dir, tmp_path):  # noqa: F811
    """The reported case: vLLM logs to stdout while it starts; the command's stdout must still
    be one JSON document."""
    pytest.importorskip("vllm")
    from models.policy import ModelSpec, build_policy, save_actor_critic
    from models.tokenizer import build_tokenizer

    texts = [f"Question: who is {i}? <answer>{i}</answer>" for i in range(200)]
    tok = build_tokenizer(texts, vocab_size=300)
    # head size 32: the smallest vLLM's CPU attention serves (a smaller one falls back to hf)
    spec = ModelSpec.from_config(ModelConfig(), hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=2,
                                 intermediate_size=64, max_position_embeddings=512)
    policy = save_actor_critic(build_policy(spec, tok), tok, tmp_path / "policy")
    overrides = ["rollout.backend=vllm", "eval.max_examples=1", "env.max_turns=1", "env.max_turn_tokens=4",
                 "env.max_context_tokens=300"]
    proc = subprocess.run([sys.executable, "-m", "cli", "evaluate", "--checkpoint", str(policy),
                           "--data", str(data_dir), "--split", "dev", "--out", str(tmp_path / "eval"),
                           *[x for o in overrides for x in ("-o", o)]],
                          cwd=ROOT, capture_output=True, text=True, timeout=FLOW_TIMEOUT_S,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO"})  # the CLI quiets vLLM unless asked
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vllm" in proc.stderr.lower(), "vLLM did not run: the test would prove nothing"
    assert json.loads(proc.stdout)["greedy/n"] == 1


# ----------------------------------------------------------------------------- two retrain flows


@pytest.mark.slow
def test_two_retrain_flows_at_once_on_a_fresh_store_leave_one_consistent_champion(
        new_store, prefect_api, data_dir, warm_dir, tmp_path):  # noqa: F811
    """Two ``agentr1 pipeline --flow retrain --json`` processes started together on a new
    store: both finish, stdout is their JSON alone, and what each says about the champion
    (summary, summary.json, run tags) fits one sequence of moves ending at the alias."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's test server
    overrides = [x for o in [f"data.dir={data_dir}", *TINY, *FAST] for x in ("-o", o)]
    runs = [seeded_run(tmp_path / name, warm_dir) for name in ("a", "b")]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "cli", "pipeline", "--flow", "retrain", "--json",
                               "--margin", "0", "--output-dir", str(run), *overrides],
                              cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for run in runs]
    outs = [p.communicate(timeout=FLOW_TIMEOUT_S) for p in procs]
    print(f"two retrain flows: {time.perf_counter() - t0:.1f}s")
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    results = [json.loads(out) for out, _ in outs]
    assert sorted(r["registered_version"] for r in results) == sorted(registered_versions()) == ["1", "2"]
    final = champion_now()
    decisions = [r["promotion"] for r in results]
    assert consistent_order(decisions, final), decisions
    c = tracking.client()
    for run, result in zip(runs, results):
        assert json.loads((run / "summary.json").read_text())["promotion"] == result["promotion"]
        info = c.get_run(result["run_id"])
        assert info.info.status == "FINISHED"
        assert info.data.tags["champion_version"] == result["promotion"]["champion_after"]
