"""Learning-curve plots (PNG), written with matplotlib's non-interactive backend."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from agentr1.metrics import EM_KEYS, MODES  # noqa: E402
from agentr1.rl.control import DEV_SCORE  # noqa: E402

CURVE_PANELS = (
    ("rollout/em", "exact match (train rollouts, sampled)"),
    ("reward/total", "reward per episode"),
    ("actor/ref_kl", "KL to the warm-up policy"),
    ("actor/pg_clipfrac", "clip fraction"),
)


def plot_learning_curve(history: list[dict[str, float]] | dict[str, list[dict[str, float]]], path: str | Path,
                        title: str = "PPO") -> Path:
    """Four panels against iteration, and exact match against wall time.

    ``history`` is one run's per-iteration metrics, or ``{label: history}`` to draw several
    runs on the same axes (e.g. ``rollout.backend=hf`` beside ``vllm``).
    """
    runs = history if isinstance(history, dict) else {"": history}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(CURVE_PANELS) + 1, figsize=(4 * (len(CURVE_PANELS) + 1), 3.2))
    for label, hist in runs.items():
        its = [h["iteration"] for h in hist]
        for ax, (key, _) in zip(axes, CURVE_PANELS):
            ax.plot(its, [h.get(key, float("nan")) for h in hist], marker=".", lw=1, label=label or None)
        dev = [(h["iteration"], h[DEV_SCORE]) for h in hist if DEV_SCORE in h]
        if dev:  # ppo.dev_every: the score that picks the final policy, beside the rollouts' EM
            axes[0].plot(*zip(*dev), marker="s", ls="--", lw=1, label=f"{label} dev score".strip())
            axes[0].legend(fontsize=8)
        axes[-1].plot([h["time/elapsed_s"] for h in hist], [h["rollout/em"] for h in hist], marker=".", lw=1,
                      label=label or None)
    for ax, (_, name) in zip(axes, CURVE_PANELS):
        ax.set_xlabel("iteration")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("wall time (s)")
    axes[-1].set_title("exact match vs wall time", fontsize=9)
    axes[-1].grid(alpha=0.3)
    if len(runs) > 1:
        axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- ablation

ABLATION_METRICS = tuple((key, f"exact match, {mode}") for mode, key in zip(MODES, EM_KEYS))
EM_AXIS_MIN = 0.1


def plot_ablation_curves(curves: dict[str, list[dict]], path: str | Path, baselines: dict[str, dict] | None = None,
                         title: str = "ablation", split: str = "dev") -> Path:
    """Held-out exact match of each variant (mean over seeds, band = one std) against PPO
    iteration and against training seconds; one row per metric of :data:`ABLATION_METRICS`.

    ``curves``: variant -> points ``{iteration, train_seconds, <metric>, <metric>/std}``;
    ``baselines``: variant -> one such point, drawn as a dashed horizontal line.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(len(ABLATION_METRICS), 2, figsize=(11, 3.4 * len(ABLATION_METRICS)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (key, label) in zip(axes, ABLATION_METRICS):
        for i, (name, points) in enumerate(curves.items()):
            color = colors[i % len(colors)]
            y = [p[key] for p in points]
            std = [p.get(f"{key}/std", math.nan) for p in points]
            std = [0.0 if math.isnan(s) else s for s in std]  # NaN: one seed, no band
            lo, hi = [a - s for a, s in zip(y, std)], [a + s for a, s in zip(y, std)]
            for ax, xkey in zip(row, ("iteration", "train_seconds")):
                x = [p[xkey] for p in points]
                ax.plot(x, y, marker=".", lw=1.2, color=color, label=name)
                ax.fill_between(x, lo, hi, color=color, alpha=0.12, lw=0)
        for j, (name, point) in enumerate((baselines or {}).items()):
            for ax in row:
                ax.axhline(point[key], ls="--", lw=1, color=colors[(len(curves) + j) % len(colors)], label=name)
        top = max([p[key] for c in curves.values() for p in c] + [b[key] for b in (baselines or {}).values()] + [0.0])
        for ax, xlabel in zip(row, ("PPO iteration", "training seconds (rollouts + updates)")):
            ax.set_ylim(-0.02, max(EM_AXIS_MIN, 1.15 * top))  # EM in [0, 1]; all-zero curves stay visible
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{label} ({split})", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
