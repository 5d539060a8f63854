"""agentr1: train tool-using LLM agents with masked PPO (the engine; no Prefect or MLflow here).

Importing the package settles how OpenMP threads wait (``agentr1.device``) before anything
imports torch, and keeps JAX (which bm25s uses if it is installed) off the GPU: every entry
point (the CLI, the flows, DVC stages, ablation workers) imports ``agentr1`` first.
"""
import os as _os

from agentr1 import device as _device

_device.configure_threads()
# bm25s (the search index) runs a JAX top-k when it is imported, if JAX is installed; on a GPU
# machine that starts JAX's GPU backend, which takes 75% of the GPU's memory for itself (the
# H200 check ran out of memory beside 30 GiB of PyTorch's own). That top-k is all the JAX the
# project runs, and it runs on the CPU; a JAX_PLATFORMS the user set wins.
_os.environ.setdefault("JAX_PLATFORMS", "cpu")
