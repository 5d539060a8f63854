"""Learning-curve plots: one run or several on the same axes."""
from __future__ import annotations

from agentr1.plots import plot_learning_curve


def _history(slope: float) -> list[dict[str, float]]:
    return [{"iteration": i, "rollout/em": slope * i, "reward/total": i, "actor/ref_kl": 0.01 * i,
             "actor/pg_clipfrac": 0.0, "time/elapsed_s": 2.0 * i} for i in range(1, 6)]


def test_one_run_and_several_runs_write_pngs(tmp_path):
    one = plot_learning_curve(_history(0.1), tmp_path / "one.png")
    both = plot_learning_curve({"hf": _history(0.1), "vllm": _history(0.05)}, tmp_path / "sub" / "both.png",
                               title="hf vs vllm")
    for path in (one, both):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert both.stat().st_size != one.stat().st_size  # the second run and the legend are drawn
