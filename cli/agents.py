"""The trained agent a command names (``--model``), for ``agentr1 ask`` and ``agentr1 serve``."""
from __future__ import annotations

import argparse


def load_agent(args: argparse.Namespace):
    """``(label, Agent)`` of the model ``args.model`` names: a registered reference, a logged
    MLflow model directory (with its ``MLmodel`` file) or a policy directory (whose run config
    is ``--config`` + ``-o``); ``args.corpus`` replaces the corpus its search tool reads."""
    from pathlib import Path

    path = Path(args.model)
    if path.is_dir() and not (path / "MLmodel").is_file():
        from agentr1.agent import Agent
        from agentr1.config import load_config
        from agentr1.data.records import corpus_path
        from agentr1.env.registry import resolve

        cfg = resolve(load_config(args.config, args.override))
        return str(path), Agent(cfg, path, args.corpus or corpus_path(cfg.data.dir))
    import mlflow

    if path.is_dir():
        uri = str(path)
    else:
        from adapters.registry import model_uri

        uri = model_uri(args.model)
    model = mlflow.pyfunc.load_model(uri, model_config={"corpus": args.corpus} if args.corpus else None)
    return uri, model.unwrap_python_model().agent  # adapters/agent_model.py's AgentModel, loaded
