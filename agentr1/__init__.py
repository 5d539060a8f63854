"""agentr1: train tool-using LLM agents with masked PPO (the engine; no Prefect or MLflow here).

Importing the package settles how OpenMP threads wait (``agentr1.threads``) before anything
imports torch: every entry point (the CLI, the flows, DVC stages, ablation workers) imports
``agentr1`` first.
"""
from agentr1 import threads as _threads

_threads.configure()
