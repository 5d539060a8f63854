"""Episodes as MLflow traces: what happened in an episode, in MLflow's Traces view of the run.

One trace per episode, linked to the run (``mlflow.search_traces(run_id=...)`` finds them):

- the root span ``episode`` (type AGENT): the question in, the answer and why the episode
  ended out; attributes: the outcome reward, the sum of the process rewards and every episode
  metric (``em``, ``f1``, ``n_calls``, ``support_recall``...);
- per assistant turn a span ``turn N`` (LLM): its text out, its sampled tokens, its process
  reward; then, when the turn was a tool call, a span named after the tool (TOOL) with the
  arguments in and the result the policy read out, or ``invalid turn`` (PARSER) with the error
  observation when the turn was not a well-formed call or answer.

Times come from the rollout engine (``Trajectory.turn_seconds``/``tool_seconds``: sampling and
environment steps are batched, so a span's time is its batch's) and are laid end to end from
the moment the episode is logged backwards; trace tags say which evaluation or PPO iteration
the episode belongs to. Nothing here changes what is trained or evaluated.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from agentr1.env.protocol import parse_turn
from agentr1.episode import Trajectory
from adapters import tracking

log = logging.getLogger("agentr1.adapters.traces")
_exporting_to: list[str] = []  # the store MLflow's trace exporter was last made for

TAG_KIND = "agentr1.trace"
"""``evaluation`` or ``ppo``."""
TAG_EVAL = "agentr1.eval"  # the evaluation's tag (warmup, final, ...) and mode
TAG_MODE = "agentr1.mode"
TAG_ITERATION = "agentr1.iteration"


def _turn_tokens(t: Trajectory) -> list[int]:
    """Sampled tokens of each turn: the action tokens between consecutive turn ends."""
    out, start = [], t.prompt_len
    for end in t.turn_ends:
        out.append(sum(t.action_mask[start: end + 1]))
        start = end + 1
    return out


def _export_to_this_store() -> None:
    """MLflow's trace exporter keeps the tracking store it was first made for: a process that
    moves to another store (a notebook, a test) sent its traces to the old one, where the
    experiment does not exist ("No Experiment with id=2 exists": the traces were lost). Made again
    when the store changes."""
    import mlflow

    tracking.client()  # MLflow's global URI follows the store
    uri = tracking.tracking_uri()
    if _exporting_to and _exporting_to[0] != uri:
        mlflow.flush_trace_async_logging()
        mlflow.tracing.reset()  # made again, for this store, at the next span
    _exporting_to[:] = [uri]


def log_episode(run_id: str | None, experiment_id: str, t: Trajectory, question: str,
                tags: Mapping[str, str]) -> str:
    """One episode as a trace in ``experiment_id``, of ``run_id`` when there is one (module
    docstring); returns the trace id."""
    import mlflow
    from mlflow.entities import SpanType
    from mlflow.tracing.constant import TraceMetadataKey

    _export_to_this_store()
    ns = 1_000_000_000
    durations = [int(s * ns) for pair in zip(t.turn_seconds, t.tool_seconds) for s in pair]
    cursor = time.time_ns() - sum(durations)
    answer = None
    root = mlflow.start_span_no_context(
        "episode", span_type=SpanType.AGENT, inputs={"question": question, "record_id": t.record_id},
        experiment_id=experiment_id, start_time_ns=cursor, tags=dict(tags),
        metadata={TraceMetadataKey.SOURCE_RUN: run_id} if run_id else None)
    tokens = _turn_tokens(t)
    for k, text in enumerate(t.turn_texts):
        sample_ns = int(t.turn_seconds[k] * ns) if k < len(t.turn_seconds) else 0
        step_ns = int(t.tool_seconds[k] * ns) if k < len(t.tool_seconds) else 0
        reward = t.process_rewards[k] if k < len(t.process_rewards) else 0.0
        span = mlflow.start_span_no_context(f"turn {k + 1}", span_type=SpanType.LLM, parent_span=root,
                                            start_time_ns=cursor)
        span.end(outputs={"text": text}, attributes={"sampled_tokens": tokens[k] if k < len(tokens) else 0,
                                                     "process_reward": reward}, end_time_ns=cursor + sample_ns)
        cursor += sample_ns
        turn = parse_turn(text)
        observation = t.observations[k] if k < len(t.observations) else None
        if turn.kind == "answer":
            answer = turn.answer
        else:
            name, kind, inputs = ((turn.name, SpanType.TOOL, turn.arguments) if turn.kind == "tool_call"
                                  else ("invalid turn", SpanType.PARSER, {"text": text}))
            span = mlflow.start_span_no_context(name, span_type=kind, parent_span=root, inputs=inputs,
                                                start_time_ns=cursor)
            span.end(outputs={"result": observation if observation is not None else turn.error},
                     attributes={"process_reward": reward}, end_time_ns=cursor + step_ns)
        cursor += step_ns
    root.end(outputs={"answer": answer, "finish": t.finish},
             attributes={"reward.outcome": t.outcome_reward, "reward.process": float(sum(t.process_rewards)),
                         **{f"metric.{k}": v for k, v in sorted(t.metrics.items())}},
             end_time_ns=max(cursor, root.start_time_ns + 1))
    return root.trace_id


@contextmanager
def _fresh_global_random() -> Iterator[None]:
    """Python's global ``random`` seeded from the OS inside, and given back as it was after.
    OpenTelemetry draws MLflow's trace and span ids from it, and the trainer seeds it with the
    run's seed: two runs with one seed drew the same trace ids, and their episodes merged into one
    trace in the store. (MLflow's own isolated generator, ``MLFLOW_TRACE_USE_ISOLATED_RANDOM_ID_
    GENERATOR``, prints an error at every interpreter exit.) Restoring the state keeps tracing from
    moving anything the run draws afterwards."""
    state = random.getstate()
    random.seed()
    try:
        yield
    finally:
        random.setstate(state)


def log_episodes(run_id: str, trajectories: Iterable[Trajectory], questions: Mapping[str, str], limit: int,
                 tags: Mapping[str, str]) -> list[str]:
    """The first ``limit`` episodes as traces of ``run_id``; returns their trace ids. A failure
    to record one is a warning: traces are for looking at, never a reason to stop a run."""
    import mlflow

    if limit <= 0:
        return []
    experiment_id = tracking.client().get_run(run_id).info.experiment_id
    ids = []
    t0 = time.perf_counter()
    with _fresh_global_random():
        for t in list(trajectories)[:limit]:
            try:
                ids.append(log_episode(run_id, experiment_id, t, questions.get(t.record_id, ""), tags))
            except Exception as err:  # noqa: BLE001 - see the docstring
                log.warning("run %s: episode %s not recorded as a trace: %s: %s", run_id, t.record_id,
                            type(err).__name__, err)
    mlflow.flush_trace_async_logging()
    log.debug("%d traces in %.2fs", len(ids), time.perf_counter() - t0)
    return ids
