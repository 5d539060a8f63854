"""Episodes as MLflow traces (adapters/traces.py): one trace per episode, linked to its run, with a
span per turn and per tool call, read back through MLflow's own trace search."""
from __future__ import annotations

import mlflow
from mlflow.entities import SpanType

from agentr1.env.protocol import format_answer, format_call
from agentr1.episode import Trajectory
from adapters import traces, tracking


def _episode(rid: str, turns: list[str], observations: list[str], outcome: float) -> Trajectory:
    ids, mask, ends = [1] * 10, [0] * 10, []
    for k, _ in enumerate(turns):
        ids += [2] * (3 + k)
        mask += [1] * (3 + k)
        ends.append(len(ids) - 1)
        if k < len(observations):
            ids += [3] * 5
            mask += [0] * 5
    return Trajectory(rid, ids, mask, [0.0] * len(ids), 10, ends, [0.2] * len(turns), outcome, "answer",
                      {"em": outcome, "n_calls": float(len(observations))}, turns, observations,
                      turn_seconds=[0.5] * len(turns), tool_seconds=[0.1] * len(turns))


def test_each_episode_is_a_trace_of_its_run_with_turn_and_tool_spans():
    with mlflow.start_run(experiment_id=tracking.experiment_id("traces-test")) as run:
        pass
    episodes = [
        _episode("q1", [format_call("search", {"query": "Tallinnar"}), format_answer("Ada")], ["Tallinnar was founded by Ada."], 1.0),
        _episode("q2", ['<tool_call>{"name": broken</tool_call>', format_answer("no")], ["Error: not valid JSON"], 0.0),
        _episode("q3", [format_answer("x")], [], 0.0),
    ]
    ids = traces.log_episodes(run.info.run_id, episodes, {"q1": "Who founded Tallinnar?"}, limit=2,
                              tags={traces.TAG_KIND: "evaluation", traces.TAG_EVAL: "final"})
    assert len(ids) == 2  # the limit
    found = {t.info.trace_id: t for t in mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")}
    assert set(found) == set(ids)
    first = found[ids[0]]
    assert first.info.tags[traces.TAG_EVAL] == "final"
    spans = {s.name: s for s in first.data.spans}
    assert set(spans) == {"episode", "turn 1", "search", "turn 2"}
    root = spans["episode"]
    assert root.span_type == SpanType.AGENT and root.inputs["question"] == "Who founded Tallinnar?"
    assert root.outputs == {"answer": "Ada", "finish": "answer"}
    assert root.attributes["reward.outcome"] == 1.0 and root.attributes["metric.em"] == 1.0
    assert root.attributes["reward.process"] == 0.4
    assert spans["search"].span_type == SpanType.TOOL and spans["search"].inputs == {"query": "Tallinnar"}
    assert spans["search"].outputs == {"result": "Tallinnar was founded by Ada."}
    assert spans["turn 1"].span_type == SpanType.LLM and spans["turn 1"].attributes["sampled_tokens"] == 3
    assert spans["turn 2"].attributes["sampled_tokens"] == 4
    # Spans lie end to end inside the episode: sampling, then the tool, then the next turn.
    assert spans["turn 1"].end_time_ns <= spans["search"].start_time_ns < spans["turn 2"].start_time_ns
    assert root.start_time_ns <= spans["turn 1"].start_time_ns and spans["turn 2"].end_time_ns <= root.end_time_ns
    broken = {s.name: s for s in found[ids[1]].data.spans}
    assert broken["invalid turn"].span_type == SpanType.PARSER
    assert broken["invalid turn"].outputs == {"result": "Error: not valid JSON"}
    assert tracking.client().get_run(run.info.run_id).info.status == "FINISHED"  # nothing else touched


def test_no_traces_when_the_limit_is_zero():
    with mlflow.start_run(experiment_id=tracking.experiment_id("traces-test")) as run:
        pass
    assert traces.log_episodes(run.info.run_id, [_episode("q", [format_answer("a")], [], 1.0)], {}, 0, {}) == []
    assert mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list") == []


def test_a_seeded_run_does_not_reuse_another_runs_trace_ids():
    """The trainer seeds Python's global `random` (every run with the same seed, the same state):
    trace ids drawn from it would repeat across runs and merge two episodes into one trace."""
    import random

    ids = []
    for _ in range(2):
        with mlflow.start_run(experiment_id=tracking.experiment_id("traces-test")) as run:
            pass
        random.seed(0)
        ids += traces.log_episodes(run.info.run_id, [_episode("q1", [format_answer("x")], [], 1.0)], {}, limit=1,
                                   tags={traces.TAG_KIND: "evaluation"})
    assert len(ids) == 2 and ids[0] != ids[1]


def test_tracing_gives_the_global_random_state_back():
    """What the run draws after tracing is what it would have drawn without it. Checked on the
    context manager itself, not around a whole `log_episodes`: other threads of a long test
    session (Dask, Prefect's workers) draw from the global `random` too, and a check spanning
    the trace export's flush saw their draws (CI, stop 35)."""
    import random

    random.seed(0)
    with traces._fresh_global_random():
        random.getrandbits(128)
    assert random.getstate() == random.Random(0).getstate(), "tracing moved the run's own random draws"


def test_traces_follow_the_process_to_another_store(tmp_path, monkeypatch):
    """MLflow's trace exporter kept the store it was first made for: after a process moved to
    another store its traces went to the old one and were lost ("No Experiment with id=2 exists"),
    which is how this module's first test failed after another test's store in the same worker."""
    episode = [_episode("q1", [format_call("search", {"query": "T"}), format_answer("Ada")], ["T: Ada."], 1.0)]
    with mlflow.start_run(experiment_id=tracking.experiment_id("traces-before")) as run:
        pass
    assert traces.log_episodes(run.info.run_id, episode, {}, limit=1, tags={})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    for name in ("traces-elsewhere-1", "traces-elsewhere-2"):  # an experiment id the first store lacks
        with mlflow.start_run(experiment_id=tracking.experiment_id(name)) as run:
            pass
    ids = traces.log_episodes(run.info.run_id, episode, {}, limit=1, tags={})
    found = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")
    assert [t.info.trace_id for t in found] == ids
    monkeypatch.undo()
    tracking.client()  # back to the session's store for the other tests
