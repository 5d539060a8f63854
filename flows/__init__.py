"""Prefect flows: pipeline, retrain, evaluate, ablation (see each module).

The engine logs its progress (warm-up steps, PPO iterations) on the ``agentr1`` logger; Prefect
shows only its own loggers unless told, so add it before Prefect sets up logging.
"""
import os

os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "agentr1")
