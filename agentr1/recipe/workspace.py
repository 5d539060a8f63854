"""What every stage shares: the data (made when missing, checked), the environment and device
(:class:`Workspace`), a policy's rollout engine, the questions an evaluation plays, and a saved
policy loaded with its chat format."""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from agentr1.config import Config, ConfigError, DataSource
from agentr1.data.splits import DEFAULT_DEV_FRACTION, DEFAULT_TEST_FRACTION, SYNTHETIC
from agentr1.data.generated import dataset_kind, generation_needed, write_dataset
from agentr1.data.records import DataError, QARecord, load_dataset, split_path
from agentr1.device import native_bf16, resolve_device
from agentr1.env.datasets import convert_sources, convert_to_dataset, write_converted
from agentr1.env.base import Environment
from agentr1.env.registry import build_env, synth_data
from agentr1.fsutil import writer_lock
from agentr1.rollout.backend import HFBackend
from agentr1.rollout.engine import RolloutEngine, RolloutSettings

log = logging.getLogger("agentr1.train")

MetricsFn = Callable[[dict[str, float], int], None]
"""``log_metrics(metrics, step)``: where a stage reports its metrics (MLflow in the pipeline)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def ensure_data(cfg: Config, source: str = SYNTHETIC, input_path: str | None = None,
                fractions: tuple[float, float] = (DEFAULT_DEV_FRACTION, DEFAULT_TEST_FRACTION)) -> Path:
    """The dataset directory, made there only when the directory does not exist or is an
    incomplete one agentr1 generated (marker): converted from ``data.sources`` when the config
    has some, else ``input_path`` converted by ``source`` (a ``SOURCE_KINDS`` converter) into
    train/dev/test by ``fractions`` (dev, test), else the environment's synthetic world. Any other
    directory is left as it is for the loader to judge: an incomplete one is refused, naming what
    is missing."""
    data_dir = Path(cfg.data.dir)
    if not generation_needed(data_dir):
        return data_dir
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with writer_lock(data_dir):  # one process makes it; another that waited finds it made
        if generation_needed(data_dir):
            _make_data(cfg, data_dir, source, input_path, fractions)
    return data_dir


def _make_data(cfg: Config, data_dir: Path, source: str, input_path: str | None,
               fractions: tuple[float, float]) -> None:
    if cfg.data.sources:
        converted = convert_sources(cfg.data.sources)
        log.info("converting %d data source(s) into %s: %s", len(cfg.data.sources), data_dir,
                 ", ".join(f"{n} {s}" for s, n in converted.summary["splits"].items()))
        write_converted(converted, data_dir)
    elif source != SYNTHETIC:
        if not input_path:
            raise ValueError(f"data source {source!r} needs an input file (data.input)")
        convert_to_dataset(DataSource(format=source, input=input_path), data_dir, fractions)
    else:
        log.info("generating the %s environment's synthetic data (seed %d) into %s",
                 cfg.env.kind, cfg.data.synth.seed, data_dir)
        generated = synth_data(cfg)
        if generated is None:
            raise DataError(data_dir, None, None, f"no dataset here, and the {cfg.env.kind!r} environment has no "
                            "generator: give data.dir a dataset (qa/{train,dev,test}.jsonl, corpus.jsonl)")
        splits, corpus, *files = generated  # a generator may add files: (splits, corpus, {name: bytes})
        write_dataset(data_dir, splits, corpus, files=files[0] if files else None)


@dataclass
class Workspace:
    """Data, environment (with its tools) and device, built once and shared by the stages (and by
    the runs of an ablation). It holds no config: every stage reads its own ``cfg``, the one
    place its settings come from."""

    data_dir: Path
    splits: dict[str, list[QARecord]]
    env: Environment
    device: torch.device
    tools_in_prompt: bool = False
    """``env.tools_in_prompt`` of the config it was built from: part of the environment."""

    @property
    def tools(self) -> list[dict] | None:
        """Tool schemas for the chat template, or None when the prompt leaves them out."""
        return self.env.tools if self.tools_in_prompt else None

    def split(self, name: str) -> list[QARecord]:
        """The records of split ``name``; a :class:`DataError` naming the missing file when the
        dataset has no such split (a converted dataset may hold only ``dev``)."""
        if name not in self.splits:
            raise DataError(split_path(self.data_dir, name), None, None,
                            f"no {name} split (the dataset has {sorted(self.splits)})")
        return self.splits[name]

    @classmethod
    def build(cls, cfg: Config) -> "Workspace":
        data_dir = ensure_data(cfg)
        recorded = dataset_kind(data_dir)
        if recorded is not None and recorded != cfg.env.kind:
            raise ConfigError(f"data.dir {data_dir} holds data converted for env.kind {recorded!r}, not "
                              f"{cfg.env.kind!r}: set env.kind={recorded}, or point data.dir at {cfg.env.kind} data")
        splits, _ = load_dataset(data_dir)  # the one schema check: bad data stops here, before any write
        return cls(data_dir, splits, build_env(cfg, data_dir), resolve_device(cfg.device), cfg.env.tools_in_prompt)


def make_engine(cfg: Config, env: Environment, model, tokenizer, chat, device) -> RolloutEngine:
    from agentr1.rollout.vllm_backend import VLLMBackend, resolve_backend

    if resolve_backend(cfg.rollout.backend, model.policy, device) == "vllm":
        dtype = torch.bfloat16 if cfg.rollout.dtype == "bf16" else None
        if dtype is not None and not native_bf16(device):
            log.warning("rollout.dtype=bf16 on a device without native bf16 (a CPU without AMX or AVX-512 BF16): "
                        "vLLM samples in emulated bf16, far slower than fp32 here; rollout.dtype=auto samples in fp32")
        backend = VLLMBackend(model.policy, device, max_model_len=cfg.env.max_context_tokens, seed=cfg.seed,
                              dtype=dtype, compile=cfg.rollout.compile)
    elif cfg.rollout.dtype != "auto":
        raise ConfigError(f"rollout.dtype={cfg.rollout.dtype}: rollout.backend={cfg.rollout.backend} samples with hf "
                          "here (vLLM is not installed or cannot serve this model: the log says which), from the "
                          "trainer's own weights; add -o rollout.dtype=auto, or install vLLM (make setup: its CPU build)")
    else:
        backend = HFBackend(model.policy, chat.pad_token_id, device)
    settings = RolloutSettings(cfg.env.max_turn_tokens, cfg.env.max_context_tokens,
                               cfg.rollout.temperature, cfg.rollout.top_p)
    return RolloutEngine(backend, chat, tokenizer, env, settings)


def eval_records(cfg: Config, ws: Workspace, split: str | None = None) -> list[QARecord]:
    """The questions an evaluation plays: split ``split`` (default ``eval.split``), its first
    ``eval.max_examples`` when that is set."""
    records = ws.split(split or cfg.eval.split)
    return records[: cfg.eval.max_examples] if cfg.eval.max_examples else records


def load_policy(ws: Workspace, path: Path):
    """The policy saved in ``path`` with its chat format."""
    from models.chat import ChatFormat
    from models.policy import load_actor_critic

    model, tokenizer = load_actor_critic(path, device=ws.device)
    return model, tokenizer, ChatFormat(tokenizer, ws.tools)
