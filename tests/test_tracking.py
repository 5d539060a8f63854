"""adapters/tracking.py against a real MLflow SQLite store (tests/conftest.py points
MLFLOW_TRACKING_URI at a temp dir). No mocks."""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import mlflow
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from mlflow.entities import LoggedModelStatus

from agentr1.config import Config, ModelConfig, config_hash, flatten
from agentr1.device import cpu_model
from adapters import lifecycle, tracking as tr

EXP = "agentr1-test-tracking"


def _run(run_id: str):
    return tr.client().get_run(run_id)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- store and keys --------------------------------------------------------------------------
def test_tracking_uri_defaults_to_sqlite_in_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    assert tr.tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"


@pytest.mark.slow
def test_experiment_artifacts_sit_next_to_the_sqlite_db():
    exp = tr.client().get_experiment(tr.experiment_id(EXP))
    db_dir = tr.tracking_uri().removeprefix("sqlite:///").rsplit("/", 1)[0]
    assert exp.artifact_location == f"file://{db_dir}/mlartifacts/{EXP}"
    assert tr.experiment_id(EXP) == exp.experiment_id  # found, not created twice


@pytest.mark.parametrize("raw, clean", [
    ("actor/pg_clipfrac", "actor/pg_clipfrac"),
    ("eval/em@3 (greedy)", "eval/em_3 _greedy_"),
    ("/a//b/./c/", "a/b/c"),
    ("../up", "__/up"),
    ("", "_"),
])
def test_key_sanitising(raw, clean):
    assert tr._key(raw) == clean


def test_long_keys_are_cut_and_stay_distinct():
    a, b = tr._key("k" * 300 + "a"), tr._key("k" * 300 + "b")
    assert len(a) == len(b) == tr.MAX_KEY_CHARS and a != b


# -- runs ---------------------------------------------------------------------------------------
def test_run_ends_finished_or_failed_and_carries_git_commit():
    with lifecycle.start_run(EXP, "ok", tags={"kind": "unit"}) as ok_id:
        assert _run(ok_id).info.status == "RUNNING"
    with pytest.raises(RuntimeError), lifecycle.start_run(EXP, "boom") as bad_id:
        raise RuntimeError("boom")
    ok, bad = _run(ok_id), _run(bad_id)
    assert (ok.info.status, bad.info.status) == ("FINISHED", "FAILED")
    assert ok.info.run_name == "ok" and ok.data.tags["kind"] == "unit"
    sha = lifecycle.git_commit()
    assert sha is not None and len(sha) == 40
    assert ok.data.tags["mlflow.source.git.commit"] == sha
    assert ok.data.tags["agentr1.git_dirty"] in ("true", "false")  # the code's repository, wherever run from


def test_a_run_stopped_by_a_signal_ends_killed_even_when_unwinding_it_failed():
    """Ctrl-C ends a run KILLED; so does an error raised while unwinding one (Prefect's task engine
    raised ValueError('Task run is not set') when SIGTERM landed as a task started)."""
    def stopped(masked: bool) -> str:
        with pytest.raises(BaseException), lifecycle.start_run(EXP, "stopped") as run_id:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                if masked:
                    raise ValueError("Task run is not set")  # noqa: B904 - its __context__ is the point
                raise
        return _run(run_id).info.status

    assert (stopped(False), stopped(True)) == ("KILLED", "KILLED")


def test_sigterm_during_a_store_write_acts_after_it_and_the_run_still_ends_killed():
    """A SIGTERM that lands inside a write to the store (here: right in the session that logs a
    metric) is acted on once the write has committed: the metric is there, the run's end is not
    refused with "database is locked" (what an interrupted commit's connection left behind: CI,
    1 in 3 SIGTERMs at the first PPO iteration), and the run ends KILLED."""
    import signal

    store = tr.client()._tracking_client.store
    reached = []
    # SIGTERM's default action, as in a fresh `agentr1` process (a Prefect runner served by an
    # earlier test leaves its own handler installed in this one)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(lifecycle.Terminated), lifecycle.start_run(EXP, "terminated-mid-write") as run_id:
            with store.ManagedSessionMaker(read_only=False):
                os.kill(os.getpid(), signal.SIGTERM)  # its handler would raise at the next bytecode
                time.sleep(0.05)
                reached.append(True)
            reached.append(False)  # not reached: the held SIGTERM acts as the session closes
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert reached == [True]
    assert _run(run_id).info.status == "KILLED"


def test_signals_are_held_only_in_the_main_thread_and_never_twice():
    import signal

    seen = {}

    def in_thread():
        with tr.signals_held():
            seen["thread"] = signal.getsignal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever an earlier test left
    try:
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        assert seen["thread"] is signal.default_int_handler
        with tr.signals_held():
            outer = signal.getsignal(signal.SIGINT)
            with tr.signals_held():
                assert signal.getsignal(signal.SIGINT) is outer
            assert outer is not signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_git_commit_is_none_outside_a_repo(tmp_path):
    assert lifecycle.git_commit(tmp_path) is None


def test_runs_record_the_process_that_owns_them():
    with lifecycle.start_run(EXP, "owner") as run_id:
        tags = _run(run_id).data.tags
    assert tags[tr.TAG_PID] == str(os.getpid()) and tags[tr.TAG_HOST] == socket.gethostname()
    assert float(tags[tr.TAG_PROCESS_STARTED]) <= time.time()
    assert tags[tr.TAG_CPU] == cpu_model() and tags[tr.TAG_CPU] != "unknown"


def test_cpuinfo_fields_are_read_by_name(tmp_path):
    from agentr1.device import cpuinfo_field

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                    "flags\t\t: fpu avx2 avx512f\nmodel name\t: another\n")
    assert cpuinfo_field("model name", info) == "AMD EPYC 7B13"  # the first core's
    assert cpuinfo_field("flags", info).split() == ["fpu", "avx2", "avx512f"]
    assert cpuinfo_field("model", info) is None  # a name, not a prefix
    assert cpuinfo_field("flags", tmp_path / "missing") is None


def test_the_sweep_ends_only_runs_whose_process_on_this_host_is_gone():
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process now
    c = tr.client()
    exp = tr.experiment_id(EXP)

    def running(tags: dict) -> str:
        return c.create_run(exp, tags={k: str(v) for k, v in tags.items()}).info.run_id

    here = {tr.TAG_HOST: socket.gethostname()}
    dead = running({**here, tr.TAG_PID: gone.pid})
    elsewhere = running({tr.TAG_HOST: "another-host", tr.TAG_PID: gone.pid})
    untagged = running({})
    reused = running({**here, tr.TAG_PID: os.getpid(), tr.TAG_PROCESS_STARTED: "1.00"})  # pid now someone else's
    live = running({**here, tr.TAG_PID: os.getpid(), tr.TAG_PROCESS_STARTED: lifecycle._process_started(os.getpid())})
    # the same process, its start time read again after the boot time moved by 20 ms (issue 48)
    drifted = running({**here, tr.TAG_PID: os.getpid(),
                       tr.TAG_PROCESS_STARTED: f"{float(lifecycle._process_started(os.getpid())) + 0.02:.2f}"})
    ended = lifecycle.end_orphaned_runs(EXP)
    assert {dead, reused} <= set(ended) and not {elsewhere, untagged, live, drifted} & set(ended)
    status = {r: _run(r).info.status for r in (dead, elsewhere, untagged, reused, live, drifted)}
    assert status == {dead: "KILLED", elsewhere: "RUNNING", untagged: "RUNNING", reused: "KILLED", live: "RUNNING",
                      drifted: "RUNNING"}
    for r in (elsewhere, untagged, live, drifted):
        c.set_terminated(r)


def test_a_study_of_more_runs_than_one_search_page_is_read_whole(monkeypatch):
    """study_runs read one page of 1,000 runs and dropped the rest without a word (issue 48)."""
    c = tr.client()
    exp = tr.experiment_id(EXP)
    ids = {c.create_run(exp, tags={"paged": "yes"}).info.run_id for _ in range(7)}
    monkeypatch.setattr(tr, "SEARCH_MAX_RESULTS", 3)
    found = {r.info.run_id for r in tr.search_all_runs([exp], "tags.paged = 'yes'")}
    assert found == ids


def test_diverged_mark_round_trips():
    with lifecycle.start_run(EXP, "diverged") as run_id:
        assert lifecycle.diverged(run_id) is None
        lifecycle.mark_diverged(run_id, "PPO iteration 2: loss nan")
    assert lifecycle.diverged(run_id) == "PPO iteration 2: loss nan"
    assert _run(run_id).data.tags[tr.TAG_DIVERGED] == "PPO iteration 2: loss nan"


def test_store_lock_is_a_file_beside_the_sqlite_db_and_nothing_for_a_server(tmp_path):
    lock = tr.store_lock(f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}")
    with lock, lock:  # re-entrant within a thread
        assert (tmp_path / "db" / "mlflow.db.lock").exists()
    assert isinstance(tr.store_lock("http://127.0.0.1:5000"), contextlib.nullcontext)


def test_nested_run_created_from_another_thread():
    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def child(parent: str, i: int) -> None:
        try:
            with lifecycle.start_run(EXP, f"variant-{i}", parent_run_id=parent) as run_id:
                tr.log_metrics(run_id, {"eval/em": 0.1 * i}, step=0)
                results[run_id] = parent
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    with lifecycle.start_run(EXP, "parent") as parent_id:
        threads = [threading.Thread(target=child, args=(parent_id, i)) for i in range(3)]
        for t in threads:
            t.start()
        tr.log_metrics(parent_id, {"parent/tick": 1.0}, step=0)  # the parent logs meanwhile
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(results) == 3
    for run_id in results:
        run = _run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        assert run.info.status == "FINISHED"
    children = tr.client().search_runs([tr.experiment_id(EXP)], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert {r.info.run_id for r in children} == set(results)


def test_system_metrics_are_sampled():
    with lifecycle.start_run(EXP, "sysmetrics", system_metrics_interval=0.2) as run_id:
        time.sleep(1.0)
    keys = _run(run_id).data.metrics
    assert "system/cpu_utilization_percentage" in keys
    assert "system/system_memory_usage_megabytes" in keys


# -- params, config, metrics ------------------------------------------------------------------
def test_log_config_flattens_cuts_long_values_and_keeps_full_yaml():
    long_prompt = "Search well. " * 600  # 7800 characters: over MLflow's 6000 limit
    cfg = Config.model_validate({"env": {"system_prompt": long_prompt}, "ppo": {"lr": 3e-4}})
    with lifecycle.start_run(EXP, "config") as run_id:
        tr.log_config(run_id, cfg)
        tr.log_config(run_id, cfg)  # a retried task logs the same values again: allowed
        tr.log_params(run_id, {"x" * 300: [1, 2]})
    run = _run(run_id)
    params = run.data.params
    flat = flatten(cfg)
    assert set(flat) <= set(params)
    assert params["ppo.lr"] == "0.0003"
    assert params["env.max_doc_chars"] == str(flat["env.max_doc_chars"])
    cut = params["env.system_prompt"]
    assert len(cut) == tr.MAX_PARAM_CHARS and cut.endswith(tr.TRUNCATED) and long_prompt.startswith(cut[:100])
    assert params[tr._key("x" * 300)] == "[1, 2]"
    assert run.data.tags[tr.TAG_CONFIG_HASH] == config_hash(cfg)
    text = mlflow.artifacts.load_text(f"runs:/{run_id}/{tr.CONFIG_ARTIFACT}")
    assert Config.model_validate(yaml.safe_load(text)) == cfg  # nothing cut in the artifact


def test_metrics_history_steps_and_non_finite_values():
    with lifecycle.start_run(EXP, "metrics") as run_id:
        for step in range(3):
            tr.log_metrics(run_id, {"actor/loss": 1.0 / (step + 1), "em@greedy": step, "bad": math.nan},
                           step=step)
        tr.log_metrics(run_id, {"em": 0.5}, step=7, prefix="eval/")
    c = tr.client()
    hist = sorted(c.get_metric_history(run_id, "actor/loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in hist] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert [m.step for m in c.get_metric_history(run_id, "em_greedy")] == [0, 1, 2]
    assert [(m.step, m.value) for m in c.get_metric_history(run_id, "eval/em")] == [(7, 0.5)]
    run = _run(run_id)
    assert "bad" not in run.data.metrics
    assert run.data.tags["nonfinite/bad"] == "nan at step 2"


def test_set_tags_skips_none():
    with lifecycle.start_run(EXP, "tags") as run_id:
        tr.set_tags(run_id, {tr.TAG_DATA_HASH: "abc123", tr.TAG_ROLLOUT_VERSION: 3, "unset": None})
    tags = _run(run_id).data.tags
    assert tags[tr.TAG_DATA_HASH] == "abc123" and tags[tr.TAG_ROLLOUT_VERSION] == "3"
    assert "unset" not in tags


def test_artifacts_text_and_plot(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "eval_final.json").write_text("{}")
    (tmp_path / "curve.png").write_bytes(b"\x89PNG fake")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    with lifecycle.start_run(EXP, "artifacts") as run_id:
        tr.log_artifacts(run_id, tmp_path / "evals", tmp_path / "curve.png", artifact_path="out")
        tr.log_text(run_id, "turn 1", "samples/traj.txt")
        tr.log_plot(run_id, tmp_path / "curve.png")
        tr.log_plot(run_id, fig, "plots/learning.png")
        with pytest.raises(FileNotFoundError, match="missing.txt"):
            tr.log_artifacts(run_id, tmp_path / "missing.txt")
    plt.close(fig)

    def listed(path: str) -> list[str]:
        return sorted(f.path for f in tr.client().list_artifacts(run_id, path))

    assert listed("out") == ["out/curve.png", "out/evals"]
    assert listed("out/evals") == ["out/evals/eval_final.json"]
    assert listed("plots") == ["plots/curve.png", "plots/learning.png"]
    assert mlflow.artifacts.load_text(f"runs:/{run_id}/samples/traj.txt") == "turn 1"


# -- datasets ---------------------------------------------------------------------------------
def test_log_dataset_jsonl_and_parquet(tmp_path):
    qa = tmp_path / "train.jsonl"
    rows = [{"id": f"q{i}", "question": f"Who {i}?", "answers": ["A"], "supporting_docs": ["d1"], "hops": 2,
             "source": "synth"} for i in range(5)]
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    roll = tmp_path / "rollouts.parquet"
    pq.write_table(pa.table({"record_id": ["q0", "q1"], "token_ids": pa.array([[1, 2, 3], [4]], pa.list_(pa.int32())),
                             "outcome_reward": [1.0, 0.0]}), roll)
    md5 = "0123456789abcdef0123456789abcdef.dir"
    with lifecycle.start_run(EXP, "datasets") as run_id:
        tr.log_dataset(run_id, qa, "qa-train", "train", digest=md5, sample_rows=3)
        tr.log_dataset(run_id, roll, "rollouts-iter0", "rollouts")
        (tmp_path / "bad.csv").write_text("a\n1\n")
        with pytest.raises(ValueError, match="bad.csv: cannot log"):
            tr.log_dataset(run_id, tmp_path / "bad.csv", "x", "x")
    inputs = {d.dataset.name: d for d in _run(run_id).inputs.dataset_inputs}
    assert set(inputs) == {"qa-train", "rollouts-iter0"}
    q = inputs["qa-train"]
    assert q.dataset.digest == md5
    assert json.loads(q.dataset.source)["uri"].endswith("train.jsonl")
    tags = {t.key: t.value for t in q.tags}
    assert tags == {"mlflow.data.context": "train", "rows_total": "5", "rows_sampled": "3"}
    assert json.loads(q.dataset.profile)["num_rows"] == 3
    assert "question" in q.dataset.schema
    r = inputs["rollouts-iter0"]
    assert {t.key: t.value for t in r.tags}["rows_total"] == "2"
    assert len(r.dataset.digest) > 0 and "token_ids" in r.dataset.schema


# -- the policy model and the registry ---------------------------------------------------------
@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from models.policy import ModelSpec, build_policy, save_actor_critic
    from models.tokenizer import build_tokenizer

    rng = random.Random(0)
    names = ["Zorvak Pellin", "Kelmora", "Drastin Vole", "Amberlin"]
    texts = [f"Question: Who directed {rng.choice(names)}? "
             f'<tool_call>{{"name": "search", "arguments": {{"query": "{rng.choice(names)}"}}}}</tool_call> '
             f"<answer>{rng.choice(names)}</answer>" for _ in range(300)]
    tok = build_tokenizer(texts, vocab_size=300)
    spec = ModelSpec.from_config(ModelConfig(), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2,
                                 intermediate_size=32)
    model = build_policy(spec, tok)
    return save_actor_critic(model, tok, tmp_path_factory.mktemp("policy") / "final")


@pytest.fixture(scope="module")
def logged_policy(policy_dir, tmp_path_factory):
    """(run_id, model_uri, seconds to log)."""
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "title": "Kelmora", "text": "Kelmora was directed by Amberlin."}) + "\n")
    cfg = Config.model_validate({"env": {"max_turn_tokens": 6, "max_turns": 2, "tools_in_prompt": True}})
    with lifecycle.start_run(EXP, "policy") as run_id:
        tr.log_config(run_id, cfg)  # as the pipeline does: the run's params, before its model
        tr.log_metrics(run_id, {"eval/em": 0.42}, step=3)
        t0 = time.perf_counter()
        uri = tr.log_policy_model(run_id, policy_dir, cfg=cfg, corpus=corpus)
        seconds = time.perf_counter() - t0
    print(f"log_policy_model: {seconds:.2f}s")
    return run_id, uri, seconds


def test_the_models_config_is_logged_beside_the_runs_own_params(logged_policy):
    """MLflow logs a model's ``model_config`` as params of its run, in one batch: a value that
    differs from the run's own param of that name (``device`` None against ``auto``) failed the
    batch, with a warning on the pipeline's console, and none of it was logged."""
    params = tr.client().get_run(logged_policy[0]).data.params
    assert params["device"] == "auto" and params["config/env/max_turns"] == "2"


def test_policy_model_logs_loads_and_predicts(logged_policy):
    """The logged agent loads from code and plays whole episodes (tests/test_agent_model.py
    covers episodes, serving and input errors)."""
    run_id, uri, _ = logged_policy
    assert uri.startswith("models:/")
    t0 = time.perf_counter()
    model = mlflow.pyfunc.load_model(uri)
    questions = pd.DataFrame({"question": ["Who directed Kelmora?", "Where was Amberlin born?", "?"]})
    out = model.predict(questions)
    print(f"load_model + predict: {time.perf_counter() - t0:.2f}s")
    assert [r["question"] for r in out] == list(questions["question"])
    assert all(1 <= r["turns"] <= 2 and r["finish"] in {"answer", "max_turns", "context"} for r in out)
    assert model.predict(questions) == out  # greedy: deterministic
    assert model.model_config["config"]["env"]["max_turn_tokens"] == 6
    assert model.model_config["config"]["env"]["tools_in_prompt"] is True
    logged = tr.client().get_logged_model(uri.removeprefix("models:/"))
    stored = Path(logged.artifact_location.removeprefix("file://"))
    files = {p.name for p in stored.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "value_head.safetensors", "tokenizer.json", "chat_template.jinja",
            "corpus.jsonl", "agent_model.py", "MLmodel"} <= files
    assert not any(name.endswith(".pkl") for name in files)  # models-from-code: nothing to unpickle
    assert logged.source_run_id == run_id and logged.status == LoggedModelStatus.READY
    assert logged.experiment_id == tr.experiment_id(EXP)


def test_logging_needs_the_corpus(policy_dir, tmp_path):
    cfg = Config.model_validate({"data": {"dir": str(tmp_path / "nowhere")}})
    with lifecycle.start_run(EXP, "no-corpus") as run_id, pytest.raises(FileNotFoundError, match="corpus"):
        tr.log_policy_model(run_id, policy_dir, cfg=cfg)


def test_register_and_champion_alias(logged_policy):
    run_id, uri, _ = logged_policy
    name = _unique("agentr1-policy-test")
    assert tr.champion(name) is None  # no such model yet
    v1 = tr.register(uri, name)
    assert v1 == "1"
    assert tr.champion(name) is None  # registered, no alias yet
    tr.set_champion(name, v1)
    assert tr.champion(name) == ("1", {"eval/em": 0.42})
    v2 = tr.register(uri, name)
    assert v2 == "2" and tr.champion(name)[0] == "1"  # a new version does not move the alias
    tr.set_champion(name, v2)
    assert tr.champion(name)[0] == "2"


def test_model_logging_is_fast_enough(logged_policy):
    assert logged_policy[2] < 30, f"log_policy_model took {logged_policy[2]:.1f}s"
