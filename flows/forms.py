"""The flows' parameters: small pydantic models that the Prefect UI renders as a form, and
the suite preset they name (the ablation preset is the ablation task's: ``tasks/ablation.py``).

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

import yaml
from pydantic import Field, ValidationError, field_validator

from agentr1.config import Config, ConfigError, Estimator, _format_validation_error, apply_overrides, load_config
from agentr1.env.registry import resolve
from agentr1.fsutil import write_text
from agentr1.presets import DEFAULT_PRESET, DataSource, Form, preset_path, spec_path
from agentr1.suite import SUITE_VARIANTS
from tasks.ablation import DEFAULT_PRESET as DEFAULT_ABLATION_PRESET, AblationSpec

RUNS_DIR = "runs"

# Form field -> dotted config key.
KNOBS = {
    "seed": "seed",
    "ppo_iterations": "ppo.iterations",
    "estimator": "ppo.estimator",
    "loss_mask": "ppo.loss_mask",
    "advantage_mask": "ppo.advantage_mask",
    "process_reward": "reward.process_enabled",
}


class ConfigForm(Form):
    """Which config a flow run uses."""

    preset: str = Field(DEFAULT_PRESET, description="A preset: a name in conf/ (e.g. train, smollm2, bfcl-smollm2) or a path to a YAML config.")
    overrides: list[str] = Field(default_factory=list,
                                 description="Dotted key=value overrides, e.g. ppo.lr=3e-4 (applied last).")
    output_dir: str | None = Field(None, description="Run directory; empty: runs/, the flow name, then the start time (UTC).")


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


# ----------------------------------------------------------------------------- ablation and suite

class AblationParams(Form):
    """The ablation flow's form: a preset, overrides (spec or training keys), the output dir."""

    preset: str = Field(DEFAULT_ABLATION_PRESET, description="An ablation preset (a name in conf/ablation/, e.g. quick) or a YAML path.")
    overrides: list[str] = Field(default_factory=list, description="Spec keys (seeds=[0,1], runner.max_workers=2, "
                                 "curve.every=5, warmup=DIR) or training keys (ppo.iterations=10, data.dir=...).")
    output_dir: str | None = Field(None, description="Ablation root (default: the preset's); the same dir resumes.")


SUITE_CONF = Path("conf") / "suite"
DEFAULT_SUITE = "default"
SET_BY_SUITE = ("variants", "seeds", "output_dir", "study", "policy")


class SuiteSpec(Form):
    """A suite preset (``conf/suite/<name>.yaml``)."""

    tasks: dict[str, dict] = Field(..., min_length=1, description="Task name -> the body of an ablation preset.")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    overrides: list[str] = Field(default_factory=list, description="Training overrides for every task, last.")
    output_dir: str = Field("runs/suite/default", description="Suite root; re-running with it resumes.")
    study: str | None = Field(None, description="Tag the suite's run with this study (`agentr1 report --study`), "
                              "each task's ablation with <study>.<task>.")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, tasks: dict[str, dict]) -> dict[str, dict]:
        for name, body in tasks.items():
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"task name {name!r}: letters, digits, '-' and '_' only (it names a directory)")
            if not isinstance(body, dict):
                raise ValueError(f"task {name!r}: a mapping of ablation keys (base, overrides, ...)")
            fixed = sorted(set(body) & set(SET_BY_SUITE))
            if fixed:
                raise ValueError(f"task {name!r}: {fixed} are set by the suite, not by a task")
        return tasks

    def task_spec(self, name: str) -> AblationSpec:
        """Task ``name``'s ablation: its body, the suite's two variants and seeds, its own root, and
        each run judged by the recipe's own final policy (the best on dev where the config selects)."""
        body = dict(self.tasks[name])
        raw = {**body, "overrides": [*(body.get("overrides") or []), *self.overrides],
               "variants": list(SUITE_VARIANTS), "seeds": self.seeds, "output_dir": str(Path(self.output_dir) / name),
               "study": f"{self.study}.{name}" if self.study else None, "policy": "recipe"}
        try:
            return AblationSpec.model_validate(raw)
        except ValidationError as err:
            raise ConfigError(_format_validation_error(err, f"suite task {name!r}")) from None


class SuiteParams(AblationParams):
    """The suite flow's form: a preset, overrides (suite keys or training keys), the root."""

    preset: str = Field(DEFAULT_SUITE, description="A suite preset (a name in conf/suite/, e.g. default) or a YAML path.")
    overrides: list[str] = Field(default_factory=list, description="Suite keys (seeds=[0], study=NAME) or training "
                                 "keys for every task (ppo.iterations=10).")
    output_dir: str | None = Field(None, description="Suite root (default: the preset's); the same dir resumes.")


def load_suite(params: SuiteParams) -> SuiteSpec:
    """The validated suite of ``params`` (a ConfigError names the bad key); every task's spec
    is checked too, before anything runs."""
    path = spec_path(params.preset, SUITE_CONF, "suite preset")
    raw = yaml.safe_load(path.read_text()) or {}
    head = [o for o in params.overrides if o.split("=", 1)[0].strip().split(".")[0] in SuiteSpec.model_fields]
    raw = apply_overrides(raw, head)
    raw["overrides"] = [*(raw.get("overrides") or []), *(o for o in params.overrides if o not in head)]
    if params.output_dir:
        raw["output_dir"] = params.output_dir
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, str(path))) from None
    for name in spec.tasks:
        spec.task_spec(name)
    return spec


def write_task_spec(spec: SuiteSpec, name: str) -> Path:
    """``<root>/<task>.yaml``: the ablation preset the task runs (what ``agentr1 ablate --preset``
    would read to run or resume that task alone)."""
    path = Path(spec.output_dir) / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, yaml.safe_dump(spec.task_spec(name).model_dump(mode="json"), sort_keys=False))
    return path
