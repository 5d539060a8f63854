"""A policy played greedy and sampled on a split (:func:`agentr1.evaluate.evaluate`), written as
``eval_<tag>.json`` and ``trajectories_<tag>.txt``; and the untrained model's baselines.

An evaluation is a function of the weights, the questions and the config (its sampled episodes
draw from ``seed + 12345`` whatever the tag), so a run directory evaluates the same weights on
the same data once: when the dev check keeps iteration 0, ``final/`` holds the warm-up's weights
and ``final`` reuses ``warmup``'s results (:data:`~agentr1.rundir.EVALUATED_FILE` records what
each tag played), the ~10 minutes of a SmolLM2 test evaluation saved."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from agentr1.config import Config, config_hash
from agentr1.env.registry import build_env
from agentr1.evaluate import EvalResult, evaluate, render_trajectory
from agentr1.fsutil import feed_file, write_json, write_text
from agentr1.recipe.warmup import build_model
from agentr1.recipe.workspace import Workspace, eval_records, load_policy, make_engine
from agentr1.rollout.engine import RolloutEngine
from agentr1.rundir import EVALUATED_FILE, weights_digest

log = logging.getLogger("agentr1.train")


def evaluation_key(cfg: Config, ws: Workspace, split: str, weights: str) -> dict:
    """What an evaluation's results are a function of: the weights' digest, the config, the
    split and every file of the dataset (questions, corpus, a tool's database)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(ws.data_dir).rglob("*") if p.is_file()):
        h.update(path.relative_to(ws.data_dir).as_posix().encode())
        feed_file(h, path)
    return {"weights": weights, "config": config_hash(cfg), "split": split, "data": h.hexdigest()}


def _evaluated(cfg: Config) -> dict:
    path = Path(cfg.output_dir) / EVALUATED_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _record(cfg: Config, tag: str, key: dict) -> None:
    write_json(Path(cfg.output_dir) / EVALUATED_FILE, {**_evaluated(cfg), tag: key})


def evaluate_dir(cfg: Config, ws: Workspace, policy_dir: str | Path, tag: str, split: str | None = None) -> EvalResult:
    """:func:`run_eval` of the policy saved in ``policy_dir``, or, when this run directory already
    evaluated the same weights on the same data with the same config, that evaluation's files
    under ``tag`` (the result then has no trajectories: they were the earlier tag's)."""
    split = split or cfg.eval.split
    key = evaluation_key(cfg, ws, split, weights_digest(policy_dir))
    out = Path(cfg.output_dir)
    for earlier, its_key in _evaluated(cfg).items():
        if its_key == key and earlier != tag and (out / f"eval_{earlier}.json").is_file():
            metrics = json.loads((out / f"eval_{earlier}.json").read_text())
            write_json(out / f"eval_{tag}.json", metrics)
            write_text(out / f"trajectories_{tag}.txt", (out / f"trajectories_{earlier}.txt").read_text())
            _record(cfg, tag, key)
            log.info("evaluation %s: the same weights as %s (sha256 %s) on the same data: its results reused", tag,
                     earlier, key["weights"][:12])
            return EvalResult(metrics, {})
    return run_eval(cfg, ws, *load_policy(ws, Path(policy_dir)), tag, split, key=key)


def run_eval(cfg: Config, ws: Workspace, model, tokenizer, chat, tag: str, split: str | None = None,
             engine: RolloutEngine | None = None, key: dict | None = None) -> EvalResult:
    """Evaluate greedy and sampled on a split; writes eval_{tag}.json and trajectories_{tag}.txt.
    ``engine`` replaces the default one (e.g. :func:`naive_rag_engine`'s). ``key``: what the
    evaluation played (:func:`evaluation_key` of the policy's saved weights), recorded so a later
    tag of the same weights on the same data reuses it (:func:`evaluate_dir`)."""
    records = eval_records(cfg, ws, split)
    reusable = key is not None and engine is None  # another engine (naive RAG) plays other episodes
    engine = engine or make_engine(cfg, ws.env, model, tokenizer, chat, ws.device)
    temp = cfg.eval.sampled_temperature or cfg.rollout.temperature
    result = evaluate(engine, records, seed=cfg.seed + 12_345, sampled_temperature=temp,
                      batch_size=cfg.eval.batch_size)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"eval_{tag}.json", result.metrics)
    questions = {r.id: r.question for r in records}
    shown = []
    for mode in ("greedy", "sampled"):
        for t in result.trajectories[mode][: cfg.eval.render_examples]:
            shown.append(f"## {mode}\n" + render_trajectory(t, tokenizer, questions[t.record_id]))
    write_text(out / f"trajectories_{tag}.txt", "\n\n".join(shown) + "\n")
    if reusable:
        _record(cfg, tag, key)
    return result


def naive_rag_engine(cfg: Config, ws: Workspace, model, tokenizer, chat, records: list) -> RolloutEngine:
    """A rollout engine playing naive RAG on ``records`` (:mod:`agentr1.rollout.forced`): a
    2-turn environment, the first turn forced to a search for the question (its first
    ``env.max_query_chars`` characters), the second to open with the answer tag."""
    from agentr1.env.protocol import ANSWER_START, format_tool_call
    from agentr1.rollout.forced import NaiveRAGBackend

    env = build_env(cfg.model_copy(update={"env": cfg.env.model_copy(update={"max_turns": 2})}), ws.data_dir)
    engine = make_engine(cfg, env, model, tokenizer, chat, ws.device)
    first = {tuple(chat.prompt_ids(env.system_turn(r), env.user_prompt(r))):
             chat.turn_ids(format_tool_call(r.question[: cfg.env.max_query_chars])) for r in records}
    engine.backend = NaiveRAGBackend(engine.backend, first, chat.prefix_ids(ANSWER_START))
    return engine


def stage_baselines(cfg: Config, ws: Workspace) -> dict[str, dict[str, float]]:
    """The untrained model of a pretrained run (``eval.baselines``) on the evaluation split, played
    and scored exactly as the trained agent will be: ``zero_shot`` (the instruct model as it comes,
    told the tool protocol only by the environment's instructions, also where the run's agent
    reads no system turn) and ``naive_rag`` (the same model after a forced search for the question). Writes ``eval_<baseline>.json`` and
    ``trajectories_<baseline>.txt``; returns their metrics by baseline."""
    model, tokenizer, chat = build_model(cfg, ws, [], [])
    model.eval()
    # An untrained model knows the tool protocol only from the instructions: where the run leaves
    # the system turn out (its agent learns the protocol in the warm-up), the baselines get the
    # environment's own.
    told = cfg if cfg.env.system_prompt != "" else \
        cfg.model_copy(update={"env": cfg.env.model_copy(update={"system_prompt": None})})
    out = {}
    for name in cfg.eval.baselines:
        log.info("baseline %s: evaluating the untrained %s on %s", name, cfg.model.name_or_path, cfg.eval.split)
        engine = naive_rag_engine(told, ws, model, tokenizer, chat, eval_records(cfg, ws)) if name == "naive_rag" \
            else make_engine(told, build_env(told, ws.data_dir), model, tokenizer, chat, ws.device)
        out[name] = run_eval(cfg, ws, model, tokenizer, chat, name, engine=engine).metrics
        log.info("baseline %s: greedy EM %.3f, sampled EM %.3f", name, out[name]["greedy/em"], out[name]["sampled/em"])
    return out
