"""The task suite's preset and its report (the flow is ``flows/suite.py``).

A suite preset (``conf/suite/<name>.yaml``) is a :class:`SuiteSpec`: named tasks, each the
body of an ablation preset (``base``, ``overrides``, ``curve``, ``runner``, ...: an
:class:`~tasks.ablation.AblationSpec` without ``variants``, ``seeds``, ``output_dir`` and
``study``, which the suite sets), the seeds, training overrides for every task, and the root
(``<output_dir>/<task>`` is each task's ablation root, ``<output_dir>/<task>.yaml`` its spec).
``key=value`` overrides address the suite when their first part is a suite field
(``seeds=[0]``, ``output_dir=DIR``) and every task's training config otherwise
(``ppo.iterations=2``).
"""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator

from agentr1.config import ConfigError, _format_validation_error, apply_overrides
from agentr1.fsutil import write_json, write_text
from agentr1.rundir import SUITE_REPORT
from agentr1.suite import SUITE_VARIANTS, TaskRow, suite_csv, suite_markdown
from tasks.ablation import AblationParams, AblationSpec, _Form, spec_path

SUITE_CONF = Path("conf") / "suite"
DEFAULT_SUITE = "default"
SET_BY_SUITE = ("variants", "seeds", "output_dir", "study", "policy")
REPORT_FILES = SUITE_REPORT


class SuiteSpec(_Form):
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


def write_suite_report(spec: SuiteSpec, rows: list[TaskRow], failures: list[dict], header: list[str]
                       ) -> tuple[str, dict[str, Path]]:
    """results.md (how it was made, the table, failures), results.csv and suite.json in the root."""
    root = Path(spec.output_dir)
    paths = {name: root / name for name in REPORT_FILES}
    lines = [*header, "", suite_markdown(rows)]
    if failures:
        lines += ["", "**Failed tasks** (re-run with the same output dir to resume them):", ""]
        lines += [f"- `{f['task']}`: {f['error']}" for f in failures]
    text = "\n".join(lines) + "\n"
    write_text(paths["results.md"], text)
    write_text(paths["results.csv"], suite_csv(rows))
    write_json(paths["suite.json"], {"spec": spec.model_dump(mode="json"), "failures": failures,
                                     "rows": [r.__dict__ for r in rows]})
    return text, paths
