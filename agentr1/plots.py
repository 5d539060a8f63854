"""Learning-curve plots (PNG), written with matplotlib's non-interactive backend."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CURVE_PANELS = (
    ("rollout/em", "exact match (train rollouts, sampled)"),
    ("reward/total", "reward per episode"),
    ("actor/ref_kl", "KL to the warm-up policy"),
    ("actor/pg_clipfrac", "clip fraction"),
)


def plot_learning_curve(history: list[dict[str, float]], path: str | Path, title: str = "PPO") -> Path:
    """Four panels against iteration, and exact match against wall time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    its = [h["iteration"] for h in history]
    fig, axes = plt.subplots(1, len(CURVE_PANELS) + 1, figsize=(4 * (len(CURVE_PANELS) + 1), 3.2))
    for ax, (key, label) in zip(axes, CURVE_PANELS):
        ax.plot(its, [h.get(key, float("nan")) for h in history], marker=".", lw=1)
        ax.set_xlabel("iteration")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    ax = axes[-1]
    ax.plot([h["time/elapsed_s"] for h in history], [h["rollout/em"] for h in history], marker=".", lw=1)
    ax.set_xlabel("wall time (s)")
    ax.set_title("exact match vs wall time", fontsize=9)
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
