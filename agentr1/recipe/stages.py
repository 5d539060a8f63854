"""The recipe's stages in order (``TRAIN_STAGES``: baselines, warmup, ppo, evaluate) and
:func:`train`, which runs them or some of them (``agentr1 train --stage``, the DVC stages)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from accelerate import PartialState

from agentr1.config import TRAIN_STAGES, Config, ConfigError
from agentr1.evaluate import EvalResult
from agentr1.metrics import HEADLINE_KEYS
from agentr1.recipe.evaluation import evaluate_dir, evaluation_key, run_eval, stage_baselines
from agentr1.recipe.outputs import final_selection, write_final_policy, write_history, write_summary
from agentr1.recipe.ppo import check_dev_split, train_ppo
from agentr1.recipe.warmup import check_demonstrable, finished_warmup, warmup
from agentr1.recipe.workspace import MetricsFn, Workspace, load_policy
from agentr1.rl.distributed import launched_processes
from agentr1.rundir import FINAL_DIR, WARMUP_DIR, claim_run_dir, weights_digest

log = logging.getLogger("agentr1.train")


def stage_warmup(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None) -> EvalResult:
    """Warm up (unless a finished warm-up of this configuration is there) and evaluate it."""
    warm_dir = Path(cfg.output_dir) / WARMUP_DIR
    if finished_warmup(cfg):
        log.info("reusing the warm-up checkpoint in %s", warm_dir)
        model, tokenizer, chat = load_policy(ws, warm_dir)
    else:
        model, tokenizer, chat = warmup(cfg, ws, log_metrics)
    return run_eval(cfg, ws, model, tokenizer, chat, "warmup",
                    key=evaluation_key(cfg, ws, cfg.eval.split, weights_digest(warm_dir)))


def stage_ppo(cfg: Config, ws: Workspace, log_metrics: MetricsFn | None = None) -> list[dict]:
    """PPO from the warm-up (resuming if a checkpoint exists); writes final/, metrics.jsonl and
    learning_curve.png."""
    history = train_ppo(cfg, ws, log_metrics)[3]
    if PartialState().is_main_process:  # data parallel: the main process writes the results
        write_final_policy(cfg)
        write_history(cfg, history)
    return history


def stage_evaluate(cfg: Config, ws: Workspace) -> dict:
    """Evaluate final/: test metrics before (warm-up) and after PPO, for summary.json."""
    out = Path(cfg.output_dir)
    after = evaluate_dir(cfg, ws, out / FINAL_DIR, "final")
    before = json.loads((out / "eval_warmup.json").read_text())
    summary = {"warmup": before, "final": after.metrics, "output_dir": str(out),
               "selected": final_selection(out / FINAL_DIR),
               "gain": {k: after.metrics[k] - before[k] for k in HEADLINE_KEYS}}
    baselines = {b: out / f"eval_{b}.json" for b in cfg.eval.baselines}
    if baselines:
        summary["baselines"] = {b: json.loads(p.read_text()) for b, p in baselines.items() if p.exists()}
    return summary


def train(cfg: Config, log_metrics: MetricsFn | None = None, stages: tuple[str, ...] = TRAIN_STAGES) -> dict:
    """The recipe, or some of its stages (``dvc.yaml`` runs them one by one); returns a
    summary with test EM before and after PPO and the seconds each stage took."""
    unknown = set(stages) - set(TRAIN_STAGES)
    if unknown:
        raise ValueError(f"unknown stage(s) {sorted(unknown)}; choose from {TRAIN_STAGES}")
    if launched_processes() > 1 and set(stages) - {"ppo"}:
        raise ConfigError(f"stages {sorted(set(stages) - {'ppo'})} run in one process; under accelerate launch "
                          "with several processes run --stage ppo only (agentr1/rl/distributed.py)")
    ws = Workspace.build(cfg)  # the data is checked before anything is written
    if {"warmup", "ppo"} & set(stages):
        ws.split("train")
    if "warmup" in stages:
        check_demonstrable(cfg, ws)
    ws.split(cfg.eval.split)
    if "ppo" in stages:
        check_dev_split(cfg, ws)
    claim_run_dir(cfg.output_dir)
    seconds: dict[str, float] = {}
    summary: dict = {}
    for stage in TRAIN_STAGES:
        if stage not in stages or (stage == "baselines" and not cfg.eval.baselines):
            continue
        t0 = time.time()
        if stage == "baselines":
            summary["baselines"] = stage_baselines(cfg, ws)
        elif stage == "warmup":
            summary["warmup"] = stage_warmup(cfg, ws, log_metrics).metrics
        elif stage == "ppo":
            summary["iterations"] = len(stage_ppo(cfg, ws, log_metrics))
        else:
            summary.update(stage_evaluate(cfg, ws))
        seconds[stage] = time.time() - t0
    summary["seconds"] = {**seconds, "total": sum(seconds.values())}
    if "evaluate" in stages:
        write_summary(cfg, summary)
    return summary
