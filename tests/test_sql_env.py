"""The SQL world (agentr1/env/sql/synth.py) and the ``sql`` environment (agentr1/env/sql/env.py):
deterministic data whose gold queries chain, an oracle at EM 1.0, an expert that is wrong in
systematic ways, process rewards on gold-chain values."""
from __future__ import annotations

import sqlite3
from collections import Counter

import pytest

from agentr1.config import Config
from agentr1.data.generated import write_dataset
from agentr1.data.records import DataError, QARecord, load_dataset
from agentr1.env.sql.synth import SQL_RELATIONS, generate
from agentr1.env.agents import ExpertNoise
from agentr1.env.episodes import run_episodes
from agentr1.env.protocol import format_answer, format_call
from agentr1.env.registry import build_env
from agentr1.env.sql.tool import DB_FILE
from agentr1.env.sql.env import SQLEnv, SQLExpertAgent, oracle


@pytest.fixture(scope="module")
def sql_world(tmp_path_factory):
    data = tmp_path_factory.mktemp("sqlenv") / "data"
    splits, corpus, files = generate(11, n_train=300, n_dev=20, n_test=100)
    write_dataset(data, splits, corpus, files=files)
    env = build_env(Config.model_validate({"env": {"kind": "sql"}, "data": {"dir": str(data)}}), data)
    return data, splits, env


def test_generation_is_byte_identical_per_seed_and_differs_across_seeds():
    a, b, c = (generate(seed, n_train=30, n_dev=3, n_test=5) for seed in (1, 1, 2))
    assert a[2][DB_FILE] == b[2][DB_FILE] and a[0] == b[0]
    assert a[2][DB_FILE] != c[2][DB_FILE] and a[0]["train"][0].question != c[0]["train"][0].question


def test_gold_queries_chain_and_foreign_keys_hold(sql_world):
    data, splits, _ = sql_world
    conn = sqlite3.connect(data / DB_FILE)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    subjects: Counter = Counter()
    for record in splits["train"] + splits["test"]:
        chain = record.meta["chain"]
        assert record.hops == len(chain) == len(record.meta["calls"]) and record.answers == (chain[-1]["answer"],)
        for k, (hop, call) in enumerate(zip(chain, record.meta["calls"])):
            assert conn.execute(call["arguments"]["query"]).fetchall() == [(hop["answer"],)]
            if k:  # each hop looks up the value the previous one returned
                assert hop["subject"] == chain[k - 1]["answer"]
            # the distractor column holds another name: a careless query reads a wrong value
            assert hop["distractor_answer"] != hop["answer"]
        subjects[chain[0]["subject"]] += 1
    assert max(subjects.values()) == 1  # fresh names: no question's entity is another's
    assert {r.meta["chain"][0]["relation"] for r in splits["train"]} == set(SQL_RELATIONS)
    assert Counter(r.hops for r in splits["train"]) == {1: 75, 2: 105, 3: 120}


def test_look_alike_rows_exist(sql_world):
    data, splits, _ = sql_world
    conn = sqlite3.connect(data / DB_FILE)
    names = [n for (n,) in conn.execute("SELECT name FROM people UNION ALL SELECT title FROM films "
                                        "UNION ALL SELECT name FROM companies UNION ALL SELECT name FROM cities")]
    chain_subjects = {h["subject"] for r in splits["train"] for h in r.meta["chain"]}
    near = sum(any(len(n) == len(s) and sum(a != b for a, b in zip(n, s)) <= 3 and n != s for n in names)
               for s in list(chain_subjects)[:50])
    assert near >= 10


def test_the_dataset_loads_with_its_database_listed_in_the_marker(sql_world):
    data, splits, _ = sql_world
    loaded, corpus = load_dataset(data)
    assert loaded["train"] == splits["train"] and [d.title for d in corpus] == ["people", "cities", "companies", "films"]
    assert DB_FILE in (data / ".agentr1-dataset").read_text()


def test_the_oracle_answers_every_question(sql_world):
    _, splits, env = sql_world
    transcripts = run_episodes(env, oracle(), splits["test"] + splits["dev"])
    assert sum(t.metrics["em"] for t in transcripts) == len(transcripts)
    assert all(t.metrics["support_recall"] == 1.0 and t.metrics["n_bad_calls"] == 0 for t in transcripts)


def test_the_expert_is_wrong_systematically_on_three_hop_questions(sql_world):
    _, splits, env = sql_world
    records = splits["train"]
    transcripts = run_episodes(env, SQLExpertAgent(ExpertNoise(seed=0)), records)
    em = {h: sum(t.metrics["em"] for t, r in zip(transcripts, records) if r.hops == h) /
          sum(r.hops == h for r in records) for h in (1, 2, 3)}
    assert em[1] > 0.75 and em[3] < 0.4  # usually one hop short on 3-hop questions
    assert any(t.metrics["n_bad_calls"] for t in transcripts)  # some malformed calls, then retries


def test_process_reward_for_a_gold_value_is_paid_once(sql_world):
    _, splits, env = sql_world
    record = next(r for r in splits["test"] if r.hops == 2)
    state = env.reset(record)
    gold = format_call("sql", {"query": record.meta["calls"][0]["arguments"]["query"]})
    first, again = env.step(state, gold), env.step(state, gold)
    assert first.info["new_support"] == 1.0 and first.process_reward == pytest.approx(0.2)
    assert again.info["new_support"] == 0.0 and again.info["valid_call"] == 1.0
    other = env.step(state, format_call("sql", {"query": "SELECT count(*) FROM films"}))
    assert other.info["new_support"] == 0.0 and other.info["valid_call"] == 1.0
    end = env.step(state, format_answer(record.answers[0]))
    assert end.done and end.info["em"] == 1.0 and env.episode_metrics(state)["support_recall"] == 0.5


def test_a_record_whose_chain_names_no_table_is_refused_before_training(sql_world, tmp_path):
    _, splits, env = sql_world
    good = splits["train"][0]
    bad_chain = [{**good.meta["chain"][0], "table": "planets"}]
    bad = QARecord("x", good.question, good.answers, (), 1, "sql", {**good.meta, "chain": bad_chain})
    with pytest.raises(DataError, match=r"train.jsonl:2: field 'chain': record 'x': .*no table 'planets'"):
        env.check_demonstrable([good, bad], tmp_path / "train.jsonl")
    assert isinstance(env, SQLEnv)


def test_cli_synth_kind_sql_writes_the_same_bytes_in_a_fresh_process(tmp_path, capsys):
    import json
    import os
    import subprocess
    import sys

    from cli.main import main

    argv = ["data", "synth", "--kind", "sql", "--seed", "3", "--n-train", "20", "--n-dev", "3", "--n-test", "4"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["splits"]["train"]["n"] == 20 and stats["db_rows"]["films"] > 0 and stats["n_docs"] == 4
    done = subprocess.run([sys.executable, "-m", "cli", *argv, "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "99"})
    assert done.returncode == 0, done.stderr
    for name in (DB_FILE, "corpus.jsonl", "qa/train.jsonl", "qa/test.jsonl", ".agentr1-dataset"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow
def test_the_logged_sql_agent_carries_its_database_and_has_its_own_registered_model(tmp_path):
    """The MLflow model of an SQL agent holds world.sqlite among its resources, beside its corpus; loaded, its sql tool
    answers from that copy (a missing database would fail the load). It is registered as
    agentr1-policy-sql, whose champion is its own: the search agent's is not touched."""
    import mlflow

    from agentr1.config import ModelConfig, load_config
    from agentr1.recipe.workspace import ensure_data
    from models.policy import ModelSpec, build_policy, save_actor_critic
    from models.tokenizer import build_tokenizer
    from adapters import lifecycle, tracking

    cfg = load_config("conf/sql.yaml", [f"data.dir={tmp_path / 'data'}", "data.synth.n_train=20", "data.synth.n_dev=2",
                                        "data.synth.n_test=4", "rollout.backend=hf", "device=cpu"])
    ensure_data(cfg)
    splits, _ = load_dataset(cfg.data.dir)
    tok = build_tokenizer([r.question for r in splits["train"]], vocab_size=300)
    spec = ModelSpec.from_config(ModelConfig(), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2,
                                 intermediate_size=32)
    policy_dir = save_actor_critic(build_policy(spec, tok), tok, tmp_path / "policy")
    with lifecycle.start_run("agentr1-test", "sql-agent") as run_id:
        uri = tracking.log_policy_model(run_id, policy_dir, cfg)
    local = __import__("pathlib").Path(mlflow.artifacts.download_artifacts(uri))
    assert (local / "artifacts" / "resources" / DB_FILE).read_bytes() == (tmp_path / "data" / DB_FILE).read_bytes()
    agent = mlflow.pyfunc.load_model(uri).unwrap_python_model().agent
    hop = splits["test"][0].meta["chain"][0]
    output = agent.env.tool("sql").fn(hop["query"])
    assert output.keys == (hop["answer"],)

    from tasks.registry import promote_if_better, register_policy

    name = tracking.model_name("sql")
    assert name == "agentr1-policy-sql" and tracking.model_name("qa") == tracking.MODEL_NAME
    qa_champion = tracking.champion_entry(tracking.MODEL_NAME)
    with lifecycle.start_run("agentr1-test", "sql-register") as run_id:
        version = register_policy.fn(cfg, str(policy_dir), run_id)
        decision = promote_if_better.fn(version, {"greedy/em": 0.5}, None, None, "greedy/em", 0.0, run_id, name)
    assert decision.promoted and str(tracking.champion_entry(name).version) == version
    after = tracking.champion_entry(tracking.MODEL_NAME)
    assert (None if qa_champion is None else qa_champion.version) == (None if after is None else after.version)


def test_the_sql_suite_checks_gold_values_and_chains(sql_world, tmp_path):
    import json
    import shutil

    from adapters import validation

    data, _, _ = sql_world
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    assert all(r.success for r in validation.validate_dataset(copy, "sql"))
    path = copy / "qa" / "test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1].pop("gold_values")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    failed = [r for r in validation.validate_dataset(copy, "sql") if not r.success]
    assert [r.suite for r in failed] == ["env_sql"]
    (failure,) = failed[0].failures
    assert failure["field"] == "gold_values" and failure["rows"][0]["line"] == 2


@pytest.mark.slow
def test_the_sql_preset_trains_end_to_end(tmp_path):
    """`agentr1 train --config conf/sql.yaml` with a tiny budget: data (database included) made,
    warm-up on the SQL expert, PPO, evaluation; the episodes query the database."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    overrides = [f"data.dir={tmp_path / 'data'}", f"output_dir={tmp_path / 'run'}", "data.synth.n_train=64",
                 "data.synth.n_dev=8", "data.synth.n_test=16", "sft.episodes=64", "sft.steps=4",
                 "sft.value_fit_episodes=16", "ppo.iterations=1", "ppo.episodes_per_iter=8", "ppo.minibatch_size=8",
                 "eval.batch_size=16", "model.vocab_size=600", "model.hidden_size=32", "model.num_layers=1",
                 "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=64"]
    cmd = [sys.executable, "-m", "cli", "train", "--config", "conf/sql.yaml"]
    for o in overrides:
        cmd += ["-o", o]
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"greedy/em", "sampled/em"} <= set(summary["final"])
    assert (tmp_path / "data" / DB_FILE).is_file()
    assert "SELECT" in (tmp_path / "run" / "trajectories_warmup.txt").read_text()
