"""Flow parameters: small pydantic models that the Prefect UI renders as a form.

A form holds a *preset* (``conf/<preset>.yaml``), the knobs people change most often, and a
free list of ``key=value`` overrides for everything else; :func:`resolve_config` turns that
into the one validated :class:`~agentr1.config.Config`. Knobs left empty keep the preset's
value; overrides are applied after the knobs, so an override wins.

A flow run writes to ``runs/<flow>/<UTC time>`` unless the form's ``output_dir`` (or an
``output_dir=`` override) names a directory: a fresh directory per run keeps a re-run from
resuming a finished run's checkpoint, while naming one on purpose resumes it.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentr1.config import Config, Estimator, load_config
from agentr1.env.registry import resolve
from agentr1.data.splits import DEFAULT_DEV_FRACTION, DEFAULT_TEST_FRACTION, SYNTHETIC
from agentr1.env.qa.convert import SOURCE_KINDS
from agentr1.errors import NotFound

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = "conf"
RUNS_DIR = "runs"
DEFAULT_PRESET = "train"

# Form field -> dotted config key.
KNOBS = {
    "seed": "seed",
    "ppo_iterations": "ppo.iterations",
    "estimator": "ppo.estimator",
    "loss_mask": "ppo.loss_mask",
    "advantage_mask": "ppo.advantage_mask",
    "process_reward": "reward.process_enabled",
}


class _Form(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConfigForm(_Form):
    """Which config a flow run uses."""

    preset: str = Field(DEFAULT_PRESET, description="A preset: a name in conf/ (e.g. train, smollm2, bfcl-smollm2) or a path to a YAML config.")
    overrides: list[str] = Field(default_factory=list,
                                 description="Dotted key=value overrides, e.g. ppo.lr=3e-4 (applied last).")
    output_dir: str | None = Field(None, description="Run directory; empty: runs/, the flow name, then the start time (UTC).")


class DataSource(_Form):
    """Where the dataset comes from when ``data.dir`` does not hold one yet."""

    kind: Literal[SOURCE_KINDS] = Field(  # type: ignore[valid-type]  (the converters' names)
        SYNTHETIC, description="synthetic: generated from data.synth; the others (hotpotqa, musique, ...): "
                               "converted from `input`.")
    input: str | None = Field(None, description="HotpotQA / MuSiQue JSON or JSON-lines file (converters only).")
    dev_fraction: float = Field(DEFAULT_DEV_FRACTION, ge=0, lt=1, description="Share of converted records put in the dev split.")
    test_fraction: float = Field(DEFAULT_TEST_FRACTION, gt=0, lt=1, description="Share of converted records put in the test split.")
    version: bool = Field(True, description="Record the dataset with `dvc add` when it lies in the DVC repo.")


class TrainForm(ConfigForm):
    """A training run: the config plus the most used knobs (empty keeps the preset's value)."""

    seed: int | None = Field(None, description="Seed of everything random.")
    ppo_iterations: int | None = Field(None, ge=0, description="PPO iterations after the warm-up.")
    estimator: Estimator | None = Field(None, description="Advantage estimator.")
    loss_mask: bool | None = Field(None, description="Keep environment tokens out of the losses.")
    advantage_mask: bool | None = Field(None, description="GAE over action tokens only.")
    process_reward: bool | None = Field(None, description="Dense process rewards on top of the outcome.")
    data: DataSource = Field(default_factory=DataSource, description="How to make the dataset if it is missing.")
    study: str | None = Field(None, description="Tag the run as part of this study (`agentr1 report --study`).")


class PipelineParams(TrainForm):
    """The end-to-end pipeline; the trained policy is registered, and becomes the champion
    when there is none yet or when it beats the champion by ``margin``."""

    margin: float = Field(0.0, ge=-1, le=1, description="Promote when challenger > champion + margin.")
    metric: str = Field("greedy/em", description="Evaluation metric that decides promotion.")


class RetrainParams(PipelineParams):
    """Scheduled retraining: a challenger on the current data, promoted only if clearly better."""

    margin: float = Field(0.02, ge=-1, le=1, description="Promote when challenger > champion + margin.")


class EvaluateParams(ConfigForm):
    """Evaluate a checkpoint directory or a registered model version / alias on a split."""

    model: str = Field("champion", description="A policy directory, a version number, an alias (e.g. champion) "
                                               "or an MLflow model URI such as models:/agentr1-policy/3 or models:/agentr1-policy@champion.")
    split: str = Field("test", description="Split of the dataset: test, dev or train (its file in qa/).")
    max_examples: int | None = Field(None, ge=1, description="Evaluate only the first N questions.")


def preset_path(preset: str) -> Path:
    """``"train"`` -> ``<repo>/conf/train.yaml``; a path is taken as is (relative to the working
    directory, else to the repository)."""
    candidates = [Path(preset)] if preset.endswith((".yaml", ".yml")) else []
    candidates += [Path(CONF_DIR) / f"{preset}.yaml"]
    for c in candidates:
        for base in (Path.cwd(), REPO_ROOT):
            if (base / c).is_file():
                return base / c
    known = sorted(p.stem for p in (REPO_ROOT / CONF_DIR).glob("*.yaml"))
    raise NotFound(f"preset {preset!r}: no such config file; presets: {known}")


def knob_overrides(form: ConfigForm) -> list[str]:
    """The form's filled-in knobs as ``key=value`` overrides."""
    values = form.model_dump()
    return [f"{key}={_yaml_scalar(values[name])}" for name, key in KNOBS.items() if values.get(name) is not None]


def _yaml_scalar(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def default_output_dir(flow: str, now: dt.datetime | None = None) -> str:
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%d-%H%M%S-%f")
    return str(Path(RUNS_DIR) / flow / stamp)


def resolve_config(form: ConfigForm, flow: str, extra: list[str] | None = None) -> Config:
    """The validated config of a flow run (raises ConfigError naming the bad key)."""
    overrides = [*knob_overrides(form), *(extra or []), *form.overrides]
    explicit = form.output_dir or any(o.split("=", 1)[0].strip() == "output_dir" for o in form.overrides)
    if not explicit:
        overrides.insert(0, f"output_dir={default_output_dir(flow)}")
    elif form.output_dir:
        overrides.insert(0, f"output_dir={form.output_dir}")
    return resolve(load_config(preset_path(form.preset), overrides))
