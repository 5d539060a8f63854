"""Evaluation: episodes on a split, greedy and sampled, with metrics and readable transcripts.

Greedy decoding hides much of what RL changes (FIELD-NOTES, pitfall 3), so both are reported.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass

from agentr1.metrics import MODES
from agentr1.episode import Trajectory
from agentr1.rollout.engine import PROGRESS_EVERY_S, RolloutEngine

# Episode metrics averaged into the report (all present in Trajectory.metrics).
log = logging.getLogger("agentr1.train")

METRIC_KEYS = ("em", "f1", "contains", "format_ok", "answered", "turns", "n_calls", "n_bad_calls",
               "retrieval_hit", "support_recall", "action_tokens")


@dataclass
class EvalResult:
    metrics: dict[str, float]
    """Flat: ``{mode}/{metric}`` and ``{mode}/hops{h}/{metric}`` for mode greedy/sampled."""
    trajectories: dict[str, list[Trajectory]]


def aggregate(trajs: list[Trajectory], hops_by_id: dict[str, int], prefix: str,
              extra: tuple[str, ...] = (), group_by_id: dict[str, str] | None = None) -> dict[str, float]:
    """Means of :data:`METRIC_KEYS` and ``extra`` (the environment's own) overall, per hop count
    and per group of ``group_by_id`` (the environment's :meth:`~agentr1.env.base.Environment.group`,
    e.g. a benchmark's category), keys ``{prefix}/...``."""
    out: dict[str, float] = {}
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[""].append(t)
        groups[f"hops{hops_by_id[t.record_id]}/"].append(t)
        if group_by_id and group_by_id.get(t.record_id):
            groups[f"{group_by_id[t.record_id]}/"].append(t)
    for g, members in sorted(groups.items()):
        for k in (*METRIC_KEYS, *extra):
            vals = [t.metrics.get(k, 0.0) for t in members]
            out[f"{prefix}/{g}{k}"] = sum(vals) / len(vals)
        out[f"{prefix}/{g}n"] = float(len(members))
    return out


def evaluate(engine: RolloutEngine, records: list, seed: int, sampled_temperature: float,
             batch_size: int = 100) -> EvalResult:
    """Run every record once greedily and once sampled at ``sampled_temperature``."""
    hops = {r.id: r.hops for r in records}
    group = getattr(engine.env, "group", None)
    labels = {r.id: group(r) for r in records} if group else None
    metrics: dict[str, float] = {}
    trajectories: dict[str, list[Trajectory]] = {}
    t0 = last = time.perf_counter()
    for mode, temp in zip(MODES, (0.0, sampled_temperature)):
        trajs: list[Trajectory] = []
        for start in range(0, len(records), batch_size):
            chunk = records[start : start + batch_size]
            trajs += engine.run(chunk, seed=seed + start, temperature=temp)
            if time.perf_counter() - last >= PROGRESS_EVERY_S:  # a pretrained model's batch takes ~1 min
                last = time.perf_counter()
                log.info("evaluation %s %d/%d episodes  %.0fs", mode, len(trajs), len(records), last - t0)
        trajectories[mode] = trajs
        metrics.update(aggregate(trajs, hops, mode, getattr(engine.env, "extra_metrics", ()), labels))
    return EvalResult(metrics, trajectories)


def render_trajectory(traj: Trajectory, tokenizer, question: str | None = None) -> str:
    """A transcript in which environment and policy spans are visibly apart.

    Environment tokens (prompt, tool responses, scaffolding) are shown in ``⟦env … ⟧`` blocks;
    what the policy sampled is shown bare, prefixed ``▶``.
    """
    lines = [f"# episode {traj.record_id}  finish={traj.finish}  outcome={traj.outcome_reward:.2f}  "
             f"process={[round(r, 2) for r in traj.process_rewards]}"]
    if question:
        lines.append(f"# question: {question}")
    start = traj.prompt_len
    lines.append(f"⟦env {tokenizer.decode(traj.token_ids[:start], skip_special_tokens=False)} ⟧")
    j = start
    while j < len(traj.token_ids):
        flag = traj.action_mask[j]
        k = j
        while k < len(traj.token_ids) and traj.action_mask[k] == flag:
            k += 1
        text = tokenizer.decode(traj.token_ids[j:k], skip_special_tokens=False)
        lines.append(f"▶ {text}" if flag else f"⟦env {text} ⟧")
        j = k
    m = traj.metrics
    lines.append(f"# em={m.get('em', 0):.0f} f1={m.get('f1', 0):.2f} calls={m.get('n_calls', 0):.0f} "
                 f"action_tokens={traj.n_action_tokens}")
    return "\n".join(lines)
