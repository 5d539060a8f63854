"""What the tool sandbox costs: tool calls in this process against calls in a sandboxed worker.

Measured side by side in one run, on the default run's data and settings (``conf/train.yaml``):

- **round trip**: one call of a trivial tool (a request to the worker and its answer);
- **search turn**: one turn of a PPO iteration's searches (``--episodes`` queries in one BM25
  batch, the environment's ``step_batch``), the way every rollout calls the search tool;
- **iteration**: the search turns of one default PPO iteration, estimated as the measured turn
  times the turns an iteration has (``--turns``: the default run's episodes make ~2.5 searches).

Each is the median of ``--repeats`` runs; the worker is started before timing (its start-up,
once per run, is reported on its own). Usage::

    python benchmarks/sandbox.py [--episodes 64] [--repeats 20] [--turns 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from agentr1.config import load_config
from agentr1.env.protocol import format_tool_call
from agentr1.env.registry import build_env
from agentr1.env.sandbox import SandboxedTool, SandboxLimits
from agentr1.env.tools import Tool
from agentr1.recipe.workspace import ensure_data


def echo(text: str) -> str:
    """Return the text.

    Args:
        text: Anything.
    """
    return text


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="conf/train.yaml")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config(args.config)
    limits = SandboxLimits.from_config(cfg.env.sandbox)
    out: dict[str, float] = {}

    plain = Tool.from_callable(echo)
    boxed = SandboxedTool(plain, limits)
    t0 = time.perf_counter()
    boxed.run_batch([{"text": "start"}])
    out["worker_start_s"] = time.perf_counter() - t0
    out["round_trip_in_process_ms"] = 1e3 * median_s(lambda: plain.run_batch([{"text": "x"}]), args.repeats)
    out["round_trip_sandboxed_ms"] = 1e3 * median_s(lambda: boxed.run_batch([{"text": "x"}]), args.repeats)
    boxed.close()

    data_dir = ensure_data(cfg)
    records = []
    from agentr1.data.records import load_dataset

    splits, _ = load_dataset(data_dir)
    records = splits["train"][: args.episodes]
    texts = [format_tool_call(r.meta["chain"][0]["query"]) for r in records]
    for mode, enabled in (("in_process", False), ("sandboxed", True)):
        env = build_env(cfg.model_copy(update={"env": cfg.env.model_copy(update={
            "sandbox": cfg.env.sandbox.model_copy(update={"enabled": enabled})})}), data_dir)
        env.step_batch([env.reset(r) for r in records], texts)  # starts the worker, warms the index
        out[f"search_turn_{mode}_ms"] = 1e3 * median_s(
            lambda: env.step_batch([env.reset(r) for r in records], texts), args.repeats)
    overhead = out["search_turn_sandboxed_ms"] - out["search_turn_in_process_ms"]
    out["iteration_overhead_ms"] = overhead * args.turns
    print(f"worker start-up: {out['worker_start_s']:.3f} s (once per tool per run, and after a worker is replaced)")
    print(f"round trip of a trivial call: {out['round_trip_in_process_ms']:.3f} ms in process, "
          f"{out['round_trip_sandboxed_ms']:.3f} ms sandboxed")
    print(f"one search turn of {args.episodes} episodes: {out['search_turn_in_process_ms']:.2f} ms in process, "
          f"{out['search_turn_sandboxed_ms']:.2f} ms sandboxed ({overhead:+.2f} ms)")
    print(f"a PPO iteration's searches ({args.turns} turns): {out['iteration_overhead_ms']:+.1f} ms from the sandbox")
    print(json.dumps({k: round(v, 4) for k, v in out.items()}))


if __name__ == "__main__":
    main()
