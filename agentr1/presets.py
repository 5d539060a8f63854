"""Where a run's inputs are named: preset files under ``conf/``, the strict form every preset
and flow form is validated as, and the data source a flow uses when ``data.dir`` holds none.

``preset_path("smollm2")`` is ``<repo>/conf/smollm2.yaml`` (a ``.yaml`` path is taken as is,
relative to the working directory, else to the repository); :func:`preset_in` does the same
for a preset folder (``conf/ablation``, ``conf/suite``). The flows' own forms are in
``flows/forms.py``; these pieces sit below the tasks, which take them as parameters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentr1.data.splits import DEFAULT_DEV_FRACTION, DEFAULT_TEST_FRACTION, SYNTHETIC
from agentr1.env.qa.convert import SOURCE_KINDS
from agentr1.errors import NotFound

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = "conf"
DEFAULT_PRESET = "train"


class Form(BaseModel):
    """A preset file's or a flow form's fields: an unknown key is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class DataSource(Form):
    """Where the dataset comes from when ``data.dir`` does not hold one yet."""

    kind: Literal[SOURCE_KINDS] = Field(  # type: ignore[valid-type]  (the converters' names)
        SYNTHETIC, description="synthetic: generated from data.synth; the others (hotpotqa, musique, ...): "
                               "converted from `input`.")
    input: str | None = Field(None, description="HotpotQA / MuSiQue JSON or JSON-lines file (converters only).")
    dev_fraction: float = Field(DEFAULT_DEV_FRACTION, ge=0, lt=1, description="Share of converted records put in the dev split.")
    test_fraction: float = Field(DEFAULT_TEST_FRACTION, gt=0, lt=1, description="Share of converted records put in the test split.")
    version: bool = Field(True, description="Record the dataset with `dvc add` when it lies in the DVC repo.")


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


def spec_path(preset: str, folder: Path, what: str) -> Path:
    """``spec_path("quick", Path("conf/ablation"), ...)`` -> ``<repo>/conf/ablation/quick.yaml``
    (a preset in ``folder``); a YAML path is taken as it is. NotFound lists the folder's presets."""
    try:
        return preset_path(preset if preset.endswith((".yaml", ".yml")) else f"{folder.name}/{preset}")
    except FileNotFoundError:
        known = sorted(p.stem for p in (REPO_ROOT / folder).glob("*.yaml"))
        raise NotFound(f"{what} {preset!r}: no such file; presets: {known}") from None
