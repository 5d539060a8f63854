"""Rollout batches as Parquet: round trip, content version, atomic write."""
from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from agentr1.rollout import store
from agentr1.episode import Trajectory


def make_trajectories() -> list[Trajectory]:
    """Two hand-built episodes: prompt, a tool call, an observation, an answer."""
    a = Trajectory(
        record_id="train-00001", token_ids=[1, 2, 3, 4, 10, 11, 12, 20, 21, 22, 13, 14],
        action_mask=[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1],
        rollout_logprobs=[0.0] * 4 + [-0.5, -1.25, -0.125] + [0.0] * 3 + [-2.0, -0.25],
        prompt_len=4, turn_ends=[6, 11], process_rewards=[0.2, 0.0], outcome_reward=1.1, finish="answer",
        metrics={"em": 1.0, "f1": 1.0, "n_calls": 1.0, "turns": 2.0}, turn_texts=["<tool_call>x</tool_call>", "<answer>y</answer>"],
        observations=["Doc 1 (T): x"], group=0)
    b = Trajectory(
        record_id="train-00002", token_ids=[1, 2, 3, 30, 31], action_mask=[0, 0, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, 0.0, -0.75, -3.5], prompt_len=3, turn_ends=[4], process_rewards=[-0.1],
        outcome_reward=0.0, finish="max_turns", metrics={"em": 0.0, "f1": 0.5, "n_calls": 0.0},
        turn_texts=["<tool_call>bad"], observations=[], group=1)
    return [a, b]


def test_round_trip_values_and_metadata(tmp_path):
    trajs = make_trajectories()
    info = store.write_rollouts(trajs, tmp_path / "it3.parquet", iteration=3, meta={"run_id": "abc", "config_hash": "f00"})
    assert info.n == 2 and info.path == tmp_path / "it3.parquet"
    assert info.version == info.sha256[:12] and len(info.sha256) == 64
    assert store.dataset_version(info.path) == info.version

    table = store.read_rollouts(info.path)
    assert table.schema.equals(store.SCHEMA)  # column names and types, metadata aside
    rows = table.to_pylist()
    assert [r["record_id"] for r in rows] == ["train-00001", "train-00002"]
    assert [r["episode"] for r in rows] == [0, 1] and [r["iteration"] for r in rows] == [3, 3]
    assert rows[0]["token_ids"] == trajs[0].token_ids and rows[0]["action_mask"] == trajs[0].action_mask
    assert rows[0]["length"] == 12 and rows[0]["n_action_tokens"] == 5 and rows[1]["n_action_tokens"] == 2
    assert rows[0]["em"] == 1.0 and rows[1]["f1"] == 0.5 and rows[0]["n_calls"] == 1
    assert store.rollout_metadata(table) == {"iteration": 3, "meta": {"config_hash": "f00", "run_id": "abc"}}

    back = store.read_trajectories(info.path)
    for orig, got in zip(trajs, back):
        assert got.token_ids == orig.token_ids and got.action_mask == orig.action_mask
        assert got.turn_ends == orig.turn_ends and got.prompt_len == orig.prompt_len
        assert got.rollout_logprobs == orig.rollout_logprobs  # chosen exactly representable in float32
        assert got.process_rewards == pytest.approx(orig.process_rewards, abs=1e-7)  # stored as float32
        assert got.outcome_reward == orig.outcome_reward and got.finish == orig.finish and got.group == orig.group
        assert got.metrics == orig.metrics and got.turn_texts == orig.turn_texts
        assert got.observations == orig.observations


def test_version_stable_for_same_content_and_changes_with_content(tmp_path):
    trajs = make_trajectories()
    v1 = store.write_rollouts(trajs, tmp_path / "a.parquet", 0, {"run_id": "r"}).version
    v2 = store.write_rollouts(make_trajectories(), tmp_path / "b.parquet", 0, {"run_id": "r"}).version
    assert v1 == v2
    trajs[1].outcome_reward = 0.5
    assert store.write_rollouts(trajs, tmp_path / "c.parquet", 0, {"run_id": "r"}).version != v1
    assert store.write_rollouts(make_trajectories(), tmp_path / "d.parquet", 1, {"run_id": "r"}).version != v1
    assert store.write_rollouts(make_trajectories(), tmp_path / "e.parquet", 0, {"run_id": "s"}).version != v1


def test_overwrite_replaces_file(tmp_path):
    path = tmp_path / "sub" / "it.parquet"  # parent created on demand
    store.write_rollouts(make_trajectories(), path, 0, {})
    info = store.write_rollouts(make_trajectories()[:1], path, 1, {})
    assert store.read_rollouts(path).num_rows == 1 and info.n == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["it.parquet"]


def test_failed_write_leaves_no_tmp_file_and_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "it.parquet"
    old = store.write_rollouts(make_trajectories(), path, 0, {})

    def boom(table, where, **kwargs):
        with open(where, "wb") as f:  # a partial file, as a crash mid-write would leave
            f.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        store.write_rollouts(make_trajectories()[:1], path, 1, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["it.parquet"]
    assert store.dataset_version(path) == old.version


def test_nan_survives_round_trip(tmp_path):
    trajs = make_trajectories()
    trajs[0].outcome_reward = float("nan")  # the store records what it is given; validation judges it
    info = store.write_rollouts(trajs, tmp_path / "x.parquet", 0, {})
    assert math.isnan(store.read_rollouts(info.path).column("outcome_reward")[0].as_py())
