"""Data tasks: make (or convert) the dataset, validate it (the engine's schema check, then the
Great Expectations suites), and only then version it with DVC.

The dataset's version is DVC's directory hash (``<md5>.dir``, what ``data.dvc`` records), so
the MLflow tag and DVC agree on which data a run saw. Inside the DVC repository a dataset that
differs from its ``.dvc`` file is recorded with ``dvc add`` (a new version); outside it (tests,
scratch directories) the hash is still computed, nothing is recorded.
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from agentr1.config import Config
from agentr1.data.records import MARKER_FILE, DataError
from agentr1.recipe.workspace import ensure_data
from adapters import tracking
from agentr1.presets import DataSource
from adapters.validation import ValidationFailed, ValidationReport, records_report, summary_markdown, validate_dataset

log = logging.getLogger("agentr1.tasks.data")

DATA_REPORT_KEY = "data-validation-report"
DVC_DIR = ".dvc"


@dataclass(frozen=True)
class DataVersion:
    """A dataset directory and its DVC identity (plain values: it travels between tasks)."""

    path: str
    md5: str
    """DVC's directory hash, e.g. ``1b69...77.dir``."""
    size: int
    nfiles: int
    dvc_file: str | None
    """The ``.dvc`` file that records this directory, when there is one."""
    recorded: bool
    """True when this run recorded a new version with ``dvc add``."""
    source: str
    checks: tuple[dict, ...] = ()
    """The validation suites it passed before it was versioned (see ``prepare_data``)."""


# ----------------------------------------------------------------------------- DVC


def dvc_root(path: Path) -> Path | None:
    """The DVC repository containing ``path`` (the nearest parent with a ``.dvc/`` dir)."""
    for parent in [path.resolve(), *path.resolve().parents]:
        if (parent / DVC_DIR).is_dir():
            return parent
    return None


class _WithoutMarker:
    """dvc_data's ignore protocol, dropping the generator's marker file: outside a DVC repository
    there is no ``.dvcignore`` (the repository's lists the marker), and the hash is the data's."""

    def walk(self, fs, path, **kwargs):
        for root, dirs, files in fs.walk(path, **kwargs):
            yield root, dirs, [f for f in files if f != MARKER_FILE]

    def find(self, fs, path, **kwargs):
        return (p for p in fs.find(path, **kwargs) if Path(p).name != MARKER_FILE)


def dir_hash(path: Path) -> tuple[str, int, int]:
    """``(md5, size, nfiles)`` of a directory exactly as ``dvc add`` would record it (with the
    ``.dvcignore`` of the DVC repository it lies in)."""
    from dvc.ignore import DvcIgnoreFilter
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs import LocalFileSystem

    fs = LocalFileSystem()
    root = dvc_root(path)
    ignore = DvcIgnoreFilter(fs, str(root)) if root is not None else _WithoutMarker()
    with tempfile.TemporaryDirectory() as scratch:  # dry run: nothing is written to an object store
        _, meta, obj = build(HashFileDB(fs, scratch), str(path.resolve()), fs, "md5", dry_run=True, ignore=ignore)
    return obj.hash_info.value, int(meta.size or 0), int(meta.nfiles or 0)


def recorded_hash(dvc_file: Path) -> str | None:
    """The md5 that a ``.dvc`` file records for its (single) output, None when absent."""
    if not dvc_file.is_file():
        return None
    outs = (yaml.safe_load(dvc_file.read_text()) or {}).get("outs") or [{}]
    return outs[0].get("md5")


def version_dataset(data_dir: Path, record: bool, source: str) -> DataVersion:
    """Hash the dataset; inside a DVC repo, ``dvc add`` it when it differs from its ``.dvc`` file."""
    md5, size, nfiles = dir_hash(data_dir)
    dvc_file = data_dir.with_name(data_dir.name + ".dvc")
    root = dvc_root(data_dir)
    recorded = False
    if record and root is not None and recorded_hash(dvc_file) != md5:
        from dvc.exceptions import DvcException
        from dvc.repo import Repo

        try:
            with Repo(str(root)) as repo:
                repo.add(str(data_dir.resolve()))
            recorded = True
            log.info("recorded a new version of %s with dvc add: %s", data_dir, md5)
        except DvcException as exc:  # e.g. the directory lies inside another tracked output
            log.warning("dataset %s not recorded by DVC: %s", data_dir, exc)
    return DataVersion(str(data_dir), md5, size, nfiles, str(dvc_file) if dvc_file.is_file() else None,
                       recorded, source)


@task(name="prepare-data", cache_policy=NO_CACHE)
def prepare_data(cfg: Config, source: DataSource, run_id: str | None = None) -> DataVersion:
    """Make the dataset in ``cfg.data.dir`` if it is not there (synthetic or converted),
    validate it, and only then version it (``dvc add``: DVC never records data that failed);
    tags the MLflow run with the DVC hash and logs the splits as its inputs.

    A dataset that fails becomes the ``data-validation-report`` artifact and the task raises
    ``ValidationFailed``: nothing is recorded, logged or trained."""
    data_dir = Path(cfg.data.dir)
    log.info("data: making %s where it is missing, then checking it (records, Great Expectations)", data_dir)
    checks = passed_suites(data_dir, dataset_reports(cfg, source))
    version = replace(version_dataset(data_dir, source.version, source.kind), checks=tuple(checks))
    if run_id:
        tracking.set_tags(run_id, {tracking.TAG_DATA_HASH: version.md5, "data_dir": str(data_dir)})
        for split_file in sorted((data_dir / "qa").glob("*.jsonl")):
            tracking.log_dataset(run_id, split_file, name=f"qa-{split_file.stem}", context=split_file.stem,
                                 digest=version.md5)
    return version


# ----------------------------------------------------------------------------- validation


def publish_failure(reports: list[ValidationReport], key: str, description: str) -> None:
    """The failing reports as a markdown artifact, then raise ValidationFailed (stops the flow)."""
    create_markdown_artifact(summary_markdown(reports), key=key, description=description)
    raise ValidationFailed(next(r for r in reports if not r.success))


def dataset_reports(cfg: Config, source: DataSource) -> list[ValidationReport]:
    """The pipeline's verdict on ``cfg.data.dir``, before anything is recorded: the data is made
    when absent (a directory it may not generate into fails the ``records`` check), then
    ``validate_dataset`` (the engine's schema check, then the GX suites). Prefect-free."""
    try:
        ensure_data(cfg, source.kind, source.input, (source.dev_fraction, source.test_fraction))
    except DataError as err:
        return [records_report(cfg.data.dir, getattr(err, "errors", [err]))]
    return validate_dataset(cfg.data.dir, cfg.env.kind)


def passed_suites(data_dir: Path, reports: list[ValidationReport]) -> list[dict]:
    """What passed, or on a failure the ``data-validation-report`` artifact and ``ValidationFailed``."""
    if not all(r.success for r in reports):
        publish_failure(reports, DATA_REPORT_KEY, f"dataset {data_dir} failed validation")
    log.info("dataset %s passed %d suites", data_dir, len(reports))
    return [{"suite": r.suite, "source": r.source, "rows": r.n_rows, "checks": r.n_checks} for r in reports]


@task(name="validate-data", cache_policy=NO_CACHE)
def validate_data(data: DataVersion) -> list[dict]:
    """The suites a dataset passed: those ``prepare_data`` ran before versioning it, or, for a
    ``DataVersion`` made elsewhere, a run of them now (``ValidationFailed`` on a failure)."""
    if data.checks:
        return list(data.checks)
    return passed_suites(Path(data.path), validate_dataset(data.path))
