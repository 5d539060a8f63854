"""A run's outputs, each with one writer whichever entry point ran the stages: ``final/`` (the
selected policy), ``metrics.jsonl`` with the learning curve, and ``summary.json``."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from agentr1 import checkpoint as ckpt
from agentr1.config import Config
from agentr1.fsutil import write_json
from agentr1.rundir import (BEST_DIR, BEST_FILE, CURVE_FILE, FINAL_DIR, HISTORY_FILE, LAST_DIR, SELECTED_FILE,
                            SUMMARY_FILE, WARMUP_DIR)

log = logging.getLogger("agentr1.train")


def selected_policy(cfg: Config) -> tuple[Path, dict]:
    """The policy a run's ``final/`` is made of, and what chose it: the best on dev
    (``checkpoints/best``, with ``ppo.dev_every``), else the last PPO checkpoint, else the
    warm-up (no iteration ran)."""
    out = Path(cfg.output_dir)
    best, last = out / BEST_DIR, out / LAST_DIR
    if cfg.ppo.dev_every and best.exists():
        record = json.loads((best / BEST_FILE).read_text())
        return best / ckpt.POLICY_DIR, {"by": f"dev {cfg.ppo.dev_metric}", "iteration": record["iteration"],
                                        "dev_score": record["score"]}
    if last.exists():
        return last / ckpt.POLICY_DIR, {"by": "last", "iteration": ckpt.load_state(last)["iteration"]}
    return out / WARMUP_DIR, {"by": "last", "iteration": 0}


def write_final_policy(cfg: Config) -> Path:
    """``final/``, a copy of :func:`selected_policy`'s choice, with ``selected.json`` saying which
    (iteration, and why); its one writer, whichever entry point ran the iterations."""
    source, selected = selected_policy(cfg)

    def write(d: Path) -> None:
        shutil.copytree(source, d, dirs_exist_ok=True)
        write_json(d / SELECTED_FILE, selected)

    log.info("final policy: iteration %d (%s)", selected["iteration"], selected["by"])
    return ckpt.atomic_dir(Path(cfg.output_dir) / FINAL_DIR, write)


def final_selection(final_dir: str | Path) -> dict | None:
    """What :func:`write_final_policy` recorded of the policy in ``final_dir`` (for summary.json)."""
    path = Path(final_dir) / SELECTED_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_history(cfg: Config, history: list[dict]) -> Path | None:
    """``metrics.jsonl`` (one line per PPO iteration) and, after at least one iteration, the
    learning curve beside it, whose path is returned: the one writer of both, whichever entry
    point ran the iterations."""
    from agentr1.plots import plot_learning_curve

    out = Path(cfg.output_dir)
    write_json(out / HISTORY_FILE, history)
    if not history:
        return None
    return plot_learning_curve(history, out / CURVE_FILE, title=f"masked PPO ({cfg.ppo.estimator})")


def write_summary(cfg: Config, summary: dict) -> Path:
    """``summary.json`` of a run (what ``agentr1 train`` returns, or the pipeline's, which adds
    the registration); its one writer."""
    return write_json(Path(cfg.output_dir) / SUMMARY_FILE, summary)
