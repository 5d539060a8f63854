"""Rollout batches as versioned Parquet files (pyarrow only).

One file holds one iteration's trajectories, one row per episode::

    record_id str | iteration int32 | episode int32 (position in the batch) | group int32
    token_ids list<int32> (T) | action_mask list<int8> (T) | rollout_logprobs list<float32> (T)
    prompt_len int32 | turn_ends list<int32> (K) | process_rewards list<float32> (K)
    outcome_reward float64 | finish str | em, f1 float64 | n_calls, length, n_action_tokens int32
    metrics map<str, float64> | turn_texts list<str> (K) | observations list<str> (<= K)

The last three columns are beyond the pipeline contract: with them ``read_trajectories`` gives
back the ``Trajectory`` objects (a Prefect task can pass a path instead of objects).
``iteration`` and the caller's ``meta`` (run id, config hash, ...) also sit in the Parquet
schema metadata. The dataset *version* is the first hex digits of the sha256 of the file
bytes: identical content gives the same version, so it can tag an MLflow run.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentr1.fsutil import atomic_file, file_sha256
from agentr1.episode import Trajectory

VERSION_CHARS = 12
FORMAT_VERSION = "1"
# Schema-metadata keys (bytes, as Parquet stores them).
META_FORMAT = b"agentr1.format"
META_ITERATION = b"agentr1.iteration"
META_USER = b"agentr1.meta"

SCHEMA = pa.schema([
    ("record_id", pa.string()),
    ("iteration", pa.int32()),
    ("episode", pa.int32()),
    ("group", pa.int32()),
    ("token_ids", pa.list_(pa.int32())),
    ("action_mask", pa.list_(pa.int8())),
    ("rollout_logprobs", pa.list_(pa.float32())),
    ("prompt_len", pa.int32()),
    ("turn_ends", pa.list_(pa.int32())),
    ("process_rewards", pa.list_(pa.float32())),
    ("outcome_reward", pa.float64()),
    ("finish", pa.string()),
    ("em", pa.float64()),
    ("f1", pa.float64()),
    ("n_calls", pa.int32()),
    ("length", pa.int32()),
    ("n_action_tokens", pa.int32()),
    ("metrics", pa.map_(pa.string(), pa.float64())),
    ("turn_texts", pa.list_(pa.string())),
    ("observations", pa.list_(pa.string())),
])


@dataclass(frozen=True)
class RolloutDatasetInfo:
    """Where a batch was written, how many episodes, and its content address."""

    path: Path
    n: int
    sha256: str
    version: str
    """``sha256[:VERSION_CHARS]``."""


def _row(t: Trajectory, iteration: int, episode: int) -> dict[str, Any]:
    m = t.metrics
    return {
        "record_id": t.record_id, "iteration": iteration, "episode": episode, "group": t.group,
        "token_ids": t.token_ids, "action_mask": t.action_mask, "rollout_logprobs": t.rollout_logprobs,
        "prompt_len": t.prompt_len, "turn_ends": t.turn_ends, "process_rewards": t.process_rewards,
        "outcome_reward": t.outcome_reward, "finish": t.finish,
        "em": m.get("em", 0.0), "f1": m.get("f1", 0.0), "n_calls": int(m.get("n_calls", 0)),
        "length": len(t.token_ids), "n_action_tokens": t.n_action_tokens,
        "metrics": list(m.items()), "turn_texts": t.turn_texts, "observations": t.observations,
    }


def to_table(trajs: list[Trajectory], iteration: int, meta: dict | None = None) -> pa.Table:
    """The batch as an Arrow table with ``SCHEMA`` and its schema metadata; ``meta`` must be JSON-able."""
    schema = SCHEMA.with_metadata({
        META_FORMAT: FORMAT_VERSION.encode(),
        META_ITERATION: str(int(iteration)).encode(),
        # sort_keys: the same meta gives the same bytes, hence the same version.
        META_USER: json.dumps(meta or {}, sort_keys=True, default=str).encode(),
    })
    return pa.Table.from_pylist([_row(t, iteration, i) for i, t in enumerate(trajs)], schema=schema)


def write_table_atomic(table: pa.Table, path: str | os.PathLike) -> RolloutDatasetInfo:
    """Write ``table`` to ``path`` via a temporary sibling file and ``os.replace``.

    A reader never sees a half-written file, and a failed write leaves no temporary file.
    """
    shas: list[str] = []

    def write(tmp: Path) -> None:
        pq.write_table(table, tmp)
        shas.append(file_sha256(tmp))

    target = atomic_file(path, write)
    return RolloutDatasetInfo(target, table.num_rows, shas[0], shas[0][:VERSION_CHARS])


def write_rollouts(trajs: list[Trajectory], path: str | os.PathLike, iteration: int,
                   meta: dict) -> RolloutDatasetInfo:
    """Write one iteration's trajectories (one row each, in order) as Parquet, atomically."""
    return write_table_atomic(to_table(trajs, iteration, meta), path)


def read_rollouts(path: str | os.PathLike) -> pa.Table:
    """The stored batch as an Arrow table (schema metadata included)."""
    return pq.read_table(path)


def rollout_metadata(table: pa.Table) -> dict[str, Any]:
    """``{"iteration": int | None, "meta": dict}`` from a batch's schema metadata."""
    raw = table.schema.metadata or {}
    iteration = raw.get(META_ITERATION)
    return {"iteration": int(iteration) if iteration is not None else None,
            "meta": json.loads(raw.get(META_USER, b"{}"))}


def dataset_version(path: str | os.PathLike) -> str:
    """The version string of a stored batch (same as ``write_rollouts(...).version``)."""
    return file_sha256(path)[:VERSION_CHARS]


def trajectories_from_table(table: pa.Table) -> list[Trajectory]:
    """Rebuild the ``Trajectory`` objects; list<float32> columns come back rounded to float32."""
    out = []
    for r in table.to_pylist():
        out.append(Trajectory(
            record_id=r["record_id"], token_ids=r["token_ids"], action_mask=r["action_mask"],
            rollout_logprobs=r["rollout_logprobs"], prompt_len=r["prompt_len"], turn_ends=r["turn_ends"],
            process_rewards=r["process_rewards"], outcome_reward=r["outcome_reward"], finish=r["finish"],
            metrics=dict(r["metrics"] or []), turn_texts=r["turn_texts"] or [],
            observations=r["observations"] or [], group=r["group"]))
    return out


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """``trajectories_from_table(read_rollouts(path))``."""
    return trajectories_from_table(read_rollouts(path))
