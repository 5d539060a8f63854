"""Run directories: which ones are ours, and which of their contents a run may reuse.

A run directory (``output_dir``) is written only when it is one of ours: it carries
:data:`MARKER`, or it is new, or nothing in it has a name a run writes (a directory with only a
DVC stage's ``validation.json`` in it, say). Anything else is refused before a byte is written,
so ``-o output_dir=~/thesis`` never overwrites someone's ``final/`` or ``summary.json``.

What a run reuses carries the configuration that made it, and is reused only for the same one:
the warm-up (``warmup/warmup_stats.json``, under ``"config"``) and the PPO checkpoint
(``checkpoints/last/state.json``). Each records only the keys its stage reads, so DVC's stages
(which delete the outputs they rebuild) and raising ``ppo.iterations`` to go on still work,
while resuming a checkpoint made with another ``ppo.lr`` is an error naming ``ppo.lr``.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from agentr1.config import Config, ConfigError, flatten
from agentr1.fsutil import feed_file, write_json

MARKER = ".agentr1-run"
# A policy directory (models.policy writes it): Hugging Face's files, and these.
VALUE_HEAD_FILE = "value_head.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"  # peft's, for a LoRA policy
WEIGHTS_GLOB = "*.safetensors"  # the policy (whole, a delta or an adapter) and its value head
WARMUP_DIR = "warmup"  # the warmed-up policy, the PPO reference
WARMUP_STATS = "warmup_stats.json"  # in WARMUP_DIR, written last: the warm-up is finished
LAST_DIR = Path("checkpoints") / "last"  # the latest PPO checkpoint
BEST_DIR = Path("checkpoints") / "best"  # with ppo.dev_every: the best policy on dev, and BEST_FILE
BEST_FILE = "best.json"
FINAL_DIR = "final"  # the trained policy, and SELECTED_FILE: which one, and why
SELECTED_FILE = "selected.json"
HISTORY_FILE = "metrics.jsonl"  # one JSON object of metrics per PPO iteration
CURVE_FILE = "learning_curve.png"
SUMMARY_FILE = "summary.json"
EVALUATED_FILE = "evaluated.json"  # which weights each eval_<tag>.json played, on what (a later tag reuses it)
DOWNLOADS_DIR = "registry"  # registered policies fetched to compare or evaluate
JOB_FILE, RESULT_FILE, CURVE_POINTS_FILE = "job.json", "result.json", "curve.jsonl"  # an ablation run's
ABLATION_REPORT = ("results.md", "results.csv", "curves.csv", "efficiency.json", "curves.png")  # an ablation root's
SUITE_REPORT = ("results.md", "results.csv", "suite.json")  # a suite root's
RUN_OUTPUTS = frozenset({
    WARMUP_DIR, "checkpoints", FINAL_DIR, "rollouts", "runs", SUMMARY_FILE, EVALUATED_FILE, HISTORY_FILE, CURVE_FILE,
    CURVE_POINTS_FILE, JOB_FILE, RESULT_FILE, DOWNLOADS_DIR, *ABLATION_REPORT, *SUITE_REPORT,
})
"""Names a run, an ablation or a suite writes at the top of its directory (besides
``eval_*.json``/``trajectories_*.txt`` and a suite's ``<task>.yaml``): a directory that holds one
and is not ours is refused."""

# Keys that do not change what a stage computes: where it writes, how long it goes on, how
# often it checkpoints or records traces, and how the result is evaluated afterwards.
_NEVER = ("output_dir", "eval.", "max_nonfinite_steps")
_WARMUP_SKIPS = (*_NEVER, "ppo.", "rollout.")
_WARMUP_KEEPS = ("ppo.mixed_precision",)  # the warm-up trains in the PPO precision
_PPO_SKIPS = (*_NEVER, "ppo.iterations", "ppo.checkpoint_every", "ppo.trace_episodes")


def _written_by_a_run(name: str) -> bool:
    return name in RUN_OUTPUTS or (name.startswith(("eval_", "trajectories_")) and "." in name)


def claim_run_dir(out: str | Path) -> Path:
    """Make ``out`` a run directory of ours, or check that it is one; raise :class:`ConfigError`
    (nothing written) when it holds outputs a run would overwrite but is not ours."""
    out = Path(out)
    if (out / MARKER).is_file():
        return out
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"output_dir {out} exists and is not a directory")
        clashing = sorted(p.name for p in out.iterdir() if _written_by_a_run(p.name))
        if clashing:
            raise ConfigError(f"output_dir {out} was not made by agentr1 (no {MARKER} file) and holds "
                              f"{', '.join(clashing[:5])}, which a run would overwrite: choose another output_dir (or, for a "
                              f"directory you set up for a run yourself, e.g. with a copied warm-up, create an "
                              f"empty {MARKER} file in it)")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                          "host": socket.gethostname(), "pid": os.getpid()}) + "\n")
    return out


def _select(flat: dict[str, Any], skips: tuple[str, ...], keeps: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in sorted(flat.items()) if k in keeps or not k.startswith(skips)}


def _warmup_skips(cfg: Config) -> tuple[str, ...]:
    # The demonstrations' rewards reach a warm-up only through the value-head fit: without one
    # (GRPO), a warm-up serves any reward weights (an outcome-only variant reuses it).
    return _WARMUP_SKIPS if cfg.sft.value_fit_episodes else (*_WARMUP_SKIPS, "reward.")


def warmup_identity(cfg: Config, recorded: dict | None = None) -> dict[str, Any]:
    """The config keys a warm-up depends on (flat, JSON-ready); with ``recorded`` (a finished
    warm-up's record), that record read the same way, so that keys an older version recorded
    but that do not matter to this configuration are left out of the comparison."""
    if recorded is not None:
        return _select(recorded, _warmup_skips(cfg), _WARMUP_KEEPS)
    return json.loads(json.dumps(_select(flatten(cfg), _warmup_skips(cfg), _WARMUP_KEEPS)))


def ppo_identity(cfg: Config) -> dict[str, Any]:
    """The config keys a PPO checkpoint depends on (flat, JSON-ready)."""
    return json.loads(json.dumps(_select(flatten(cfg), _PPO_SKIPS)))


def changed_keys(before: dict, now: dict) -> list[str]:
    return sorted(k for k in {*before, *now} if before.get(k) != now.get(k))


def check_same_config(recorded: dict | None, current: dict, what: Path, fix: str) -> None:
    """Raise :class:`ConfigError` unless ``what`` was made with ``current`` (``recorded``)."""
    if recorded is None:
        raise ConfigError(f"{what} records no configuration (made by an older version?), so it cannot be "
                          f"reused safely: {fix}")
    changed = changed_keys(recorded, current)
    if changed:
        shown = ", ".join(f"{k} ({recorded.get(k)!r} then, {current.get(k)!r} now)" for k in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ConfigError(f"{what} was made with another configuration: {shown}{more}; {fix}")


def claim(path: Path, identity: dict) -> None:
    """Record ``identity`` in ``path``, or check that an earlier attempt recorded the same one:
    resuming a directory made with another config would mix two experiments."""
    if path.exists():
        check_same_config(json.loads(path.read_text()), identity, path.parent,
                          f"use another output_dir, or delete {path.parent} to start it again")
        return
    write_json(path, identity)


def weights_digest(policy_dir: str | Path) -> str:
    """sha256 over a policy directory's weight files (policy and value head, by name): two
    warm-ups are the same warm-up exactly when this is equal (a seed alone does not say so: the
    thread count changes the weights)."""
    files = sorted(Path(policy_dir).glob(WEIGHTS_GLOB))
    if not files:
        raise FileNotFoundError(f"{policy_dir}: no {WEIGHTS_GLOB} weights to digest")
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        feed_file(h, path)
    return h.hexdigest()
