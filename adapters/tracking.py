"""The one thin MLflow module: runs, params, metrics, datasets, artifacts, the policy model
and its registry entry. Everything else logs through here.

Every function takes an explicit ``run_id`` and logs with ``MlflowClient``: MLflow's "active
run" is thread-local, and Prefect runs tasks in worker threads, so nothing here relies on it.
A run started in one thread can be logged to, or be the parent of a nested run, from any other.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///mlflow.db`` in the current working
directory (MLflow 3 refuses the old ``./mlruns`` file store). With a SQLite store the
artifacts of experiment ``E`` live in ``<db dir>/mlartifacts/E``; with a server, where the
server puts them.

Several processes may share one SQLite store (two scheduled flows, an ablation's workers): a
file lock next to the database (``<db>.lock``, :func:`store_lock`) serialises the two steps
that are not safe to race, MLflow creating the schema on first use and moving the champion
alias (compare-and-set, in ``tasks.registry``). A run's start and end, and the sweep of runs
whose process died, are :mod:`adapters.lifecycle`'s.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import pandas as pd
import yaml
from filelock import FileLock
from mlflow import MlflowClient
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID

from agentr1.config import Config, config_hash, flatten
from agentr1.rundir import ADAPTER_CONFIG_FILE

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)

# One experiment per flow kind.
EXPERIMENTS = {
    "pipeline": "agentr1-pipeline",
    "retrain": "agentr1-retrain",
    "ablation": "agentr1-ablation",
    "evaluate": "agentr1-evaluate",
}
MODEL_NAME = "agentr1-policy"


def model_name(env_kind: str) -> str:
    """The registered model of an environment kind: ``agentr1-policy`` for the search agent
    (``qa``), ``agentr1-policy-<kind>`` for the others, so each kind has its own versions and
    champion, and a challenger is never compared with another kind's agent."""
    return MODEL_NAME if env_kind == "qa" else f"{MODEL_NAME}-{env_kind}"
CHAMPION = "champion"
DEFAULT_DB = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"

# MLflow's own limits (mlflow.utils.validation); longer values are rejected, not cut.
MAX_KEY_CHARS = 250
MAX_PARAM_CHARS = 6000
MAX_TAG_CHARS = 8000
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_DIGEST_CHARS = 36
MAX_INPUT_TAG_CHARS = 500
TRUNCATED = "...[truncated]"
KEY_HASH_CHARS = 8  # suffix that keeps two long keys sharing a prefix apart after cutting
ILLEGAL_KEY_CHARS = re.compile(r"[^\w\-. /:]")  # MLflow allows alphanumerics, _ - . space / :

# Tags every tracked run may carry (besides MLflow's own).
TAG_CONFIG_HASH = "config_hash"
TAG_DATA_HASH = "dvc_data_hash"
TAG_ROLLOUT_VERSION = "rollout_dataset_version"
TAG_NONFINITE = "nonfinite"  # prefix: "nonfinite/<metric key>" -> "nan at step 3"
TAG_DIVERGED = "agentr1.diverged"  # -> why; a run carrying it may not register a model
TAG_PID = "agentr1.pid"  # the process that owns the run (with its host and start time)
TAG_HOST = "agentr1.host"
TAG_PROCESS_STARTED = "agentr1.process_started"  # a pid reused by a later process is not taken for the owner
TAG_ENDED_BY = "agentr1.ended_by"  # set when someone other than the owner ended the run
TAG_PREFECT_FLOW_RUN = "prefect_flow_run_id"  # the Prefect flow run a flow's MLflow run belongs to
TAG_STUDY = "agentr1.study"  # the published result a run belongs to (`agentr1 report --study`)
TAG_SUITE_PRESET = "suite.preset"  # a suite flow's parent run: the preset it ran
TAG_SUITE_TASK = "agentr1.suite.task"  # a task's ablation parent run, nested under its suite's run
TAG_WARMUP_DIGEST = "agentr1.warmup_digest"  # sha256 of the warm-up weights a run started from
TAG_GIT_DIRTY = "agentr1.git_dirty"  # "true": tracked files differed from the commit when the run started
TAG_CPU = "agentr1.cpu"  # the CPU model: float kernels differ by CPU, so the same commit, config and threads give
# other weights on another machine (docs/design.md, Determinism): two runs are comparable bit for bit only on one
CODE_DIR = Path(__file__).resolve().parent  # the commit a run records is the code's, wherever it was started

LOCK_SUFFIX = ".lock"
STORE_LOCK_TIMEOUT_S = 600.0  # a holder does milliseconds of SQL; minutes mean something is stuck

CONFIG_ARTIFACT = "config/config.yaml"
DATASET_SAMPLE_ROWS = 1000  # rows read for a dataset's schema and profile; the digest covers the file
SEARCH_MAX_RESULTS = 1000  # runs per page of a search (MLflow's largest page is 50,000)


def search_all_runs(experiment_ids: list[str], query: str) -> list:
    """Every run of ``experiment_ids`` matching ``query``, page by page (one page stops at
    :data:`SEARCH_MAX_RESULTS`: a study of more runs lost the rest without a word)."""
    c, runs, token = client(), [], None
    while True:
        page = c.search_runs(experiment_ids, query, max_results=SEARCH_MAX_RESULTS, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs

# The agent as an MLflow model (models-from-code: this file is the model).
AGENT_MODEL_CODE = Path(__file__).with_name("agent_model.py")
POLICY_ARTIFACT = "policy"
RESOURCES_ARTIFACT = "resources"
"""A directory: the dataset's resources (``agentr1.data.records.resource_files``: the corpus, the
SQL world's database, whatever a plug-in's generator wrote), which the tools read."""
CORPUS_ARTIFACT = "corpus"
"""A model logged before its resources travelled as one directory: its corpus file (loaded still)."""
PLUGIN_ARTIFACT = "plugin_"
"""Prefix of the artifacts holding the run's plug-in ``.py`` files (``plugin_0``, ...)."""
MCP_ARTIFACT = "mcp_"
"""``mcp_<server>_<argument>``: a file an MCP server's command names (agentr1.env.mcp.command_files)."""
QUESTION = "question"  # the model's input column; or one agent conversation in either of:
FUNCTIONS = "functions"  # beside "question", for a function-calling agent: each row's function documents (JSON)
RESPONSES_INPUT = "input"  # MLflow ResponsesAgent requests
CHAT_MESSAGES = "messages"  # MLflow ChatAgent requests
AGENT_SECTIONS = ("seed", "env", "reward", "rollout")  # the config an episode depends on
MODEL_REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "pandas", "mlflow", "pydantic",
                      "bm25s", "PyStemmer", "scipy", "numpy")


# -- store -----------------------------------------------------------------------------------
def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / DEFAULT_DB}"


def client() -> MlflowClient:
    """A client on :func:`tracking_uri`; also points MLflow's global URI there, so its fluent
    helpers (model logging, registration, ``pyfunc.load_model``) see the same store."""
    uri = tracking_uri()
    if mlflow.get_tracking_uri() != uri:
        mlflow.set_tracking_uri(uri)
    return _client(uri)


@functools.lru_cache(maxsize=4)
def _client(uri: str) -> MlflowClient:
    # Opening a SQLite store checks its schema (seconds the first time): once per URI. MLflow
    # creates the tables of a new database when a store object is first built, and two
    # processes doing that at once collide ("table assessments already exists"): both stores
    # (runs and registry; MLflow caches them per URI, its fluent API included) are opened here,
    # under the store lock.
    # (The warning hidden is about MLflow's own SQLAlchemy usage.)
    with _quiet(".*``noload`` loader strategy is deprecated"), store_lock(uri):
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)
        c.search_registered_models(max_results=1)
    for store in (c._tracking_client.store, c._get_registry_client().store):
        _hold_signals_in_sessions(store)
    return c


TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_held_depth = 0  # main thread only: signals_held inside signals_held holds nothing more


@contextmanager
def signals_held(signums: tuple[int, ...] = TERMINATING_SIGNALS) -> Iterator[None]:
    """Hold ``signums`` while the body runs in the main thread, then act on the first that came.

    Python runs a signal's handler between two bytecodes of the main thread. A handler that
    raises (Ctrl-C's KeyboardInterrupt, :class:`Terminated`, Prefect's ``TerminationSignal``)
    inside SQLAlchemy's commit or connection clean-up left a SQLite connection holding the write
    lock, and the run's own end then failed "database is locked" (1 SIGTERM in 3 at the first PPO
    iteration's metrics). Held, a write to the store completes (milliseconds) and the signal
    acts right after it, through the handler that was in place. Only handlers written in Python
    are held: an ignored signal stays ignored, a default one still ends the process. In any
    other thread the body just runs (handlers run in the main thread only)."""
    global _held_depth
    if threading.current_thread() is not threading.main_thread() or _held_depth:
        yield
        return
    came: list[tuple[int, Any]] = []
    previous = {s: signal.getsignal(s) for s in signums}
    held = {s: h for s, h in previous.items() if callable(h)}
    for s in held:
        signal.signal(s, lambda signum, frame: came.append((signum, frame)))
    _held_depth += 1
    try:
        yield
    finally:
        _held_depth -= 1
        for s, h in held.items():
            signal.signal(s, h)
        if came:
            signum, frame = came[0]
            held[signum](signum, frame)


def _hold_signals_in_sessions(store) -> None:
    """Make every database session of an MLflow SQL store (MLflow caches one per URI, its fluent
    API included) run under :func:`signals_held`. Other stores (a tracking server) have none."""
    open_session = getattr(store, "ManagedSessionMaker", None)
    if open_session is None or getattr(open_session, "agentr1_signals_held", False):
        return

    @contextmanager
    def held_session(*args, **kwargs):
        with signals_held(), open_session(*args, **kwargs) as session:
            yield session

    held_session.agentr1_signals_held = True
    store.ManagedSessionMaker = held_session


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def store_lock(uri: str | None = None) -> AbstractContextManager:
    """An inter-process lock on the SQLite store at ``uri`` (default :func:`tracking_uri`):
    the file ``<db>.lock`` beside the database. Re-entrant in one thread; a process that dies
    holding it releases it (an OS file lock). For a tracking server it is a no-op: the server
    holds no lock across requests, and callers check what they wrote instead."""
    db = sqlite_path(uri or tracking_uri())
    if db is None:
        return nullcontext()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(f"{db.resolve()}{LOCK_SUFFIX}", timeout=STORE_LOCK_TIMEOUT_S, is_singleton=True)


class _DropMatching(logging.Filter):
    def __init__(self, patterns: list[re.Pattern]):
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(p.match(record.getMessage()) for p in self.patterns)


@contextmanager
def _quiet(*messages: str, logger: str | None = None) -> Iterator[None]:
    """Hide MLflow's advisory warnings matching ``messages`` (regexes) for one call: Python
    warnings, and records of the named ``logger`` when given.

    (``catch_warnings`` swaps the process-wide filter list: a thread logging at the same
    moment may see a warning filter come or go, nothing more.)"""
    drop = _DropMatching([re.compile(m) for m in messages])
    target = logging.getLogger(logger) if logger else None
    with warnings.catch_warnings():
        for message in messages:
            warnings.filterwarnings("ignore", message=message)
        if target:
            target.addFilter(drop)
        try:
            yield
        finally:
            if target:
                target.removeFilter(drop)


def _artifact_location(uri: str, experiment: str) -> str | None:
    """``<db dir>/mlartifacts/<experiment>`` for a SQLite store (MLflow would default to a
    ``./mlruns`` relative to wherever the process runs); None lets a server decide."""
    db = sqlite_path(uri)
    return None if db is None else (db.parent / ARTIFACTS_DIR / experiment).resolve().as_uri()


def experiment_id(name: str) -> str:
    """The id of experiment ``name``, created on first use (safe when threads race to create it)."""
    c = client()
    found = c.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return c.create_experiment(name, artifact_location=_artifact_location(tracking_uri(), name))
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return c.get_experiment_by_name(name).experiment_id


def set_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    """Set tags (values stringified, None skipped), e.g. ``{TAG_DATA_HASH: md5,
    TAG_ROLLOUT_VERSION: "3"}``."""
    items = [RunTag(k, v) for k, v in clean_tags(tags).items()]
    for chunk in _chunks(items, MAX_PARAMS_PER_BATCH):
        client().log_batch(run_id, tags=chunk)


def nest_run(run_id: str, parent_run_id: str, tags: Mapping[str, Any] | None = None) -> None:
    """Show run ``run_id`` under ``parent_run_id`` in the MLflow UI (MLflow's parent-run tag),
    with ``tags`` beside it (a suite nests each task's ablation run so)."""
    set_tags(run_id, {MLFLOW_PARENT_RUN_ID: parent_run_id, **(tags or {})})


def clean_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tags as MLflow takes them: sanitised keys, values stringified and cut to MLflow's limit; None values left out."""
    return {_key(k): _cut(str(v), MAX_TAG_CHARS) for k, v in tags.items() if v is not None}


# -- params, config, metrics --------------------------------------------------------------------
def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(TRUNCATED)] + TRUNCATED


def _key(key: str) -> str:
    """A key MLflow accepts: illegal characters -> "_", no empty/"."/".." path parts or
    leading "/", at most 250 characters (cut ones end in a hash of the full key)."""
    parts = [ILLEGAL_KEY_CHARS.sub("_", p) for p in str(key).split("/")]
    clean = "/".join("__" if p == ".." else p for p in parts if p not in ("", ".")) or "_"
    if len(clean) > MAX_KEY_CHARS:
        digest = hashlib.sha256(clean.encode()).hexdigest()[:KEY_HASH_CHARS]
        clean = f"{clean[: MAX_KEY_CHARS - KEY_HASH_CHARS - 1]}-{digest}"
    return clean


def _param_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return _cut(text, MAX_PARAM_CHARS)


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i: i + size]


def log_params(run_id: str, params: Mapping[str, Any]) -> None:
    """Log params (keys sanitised, values over 6000 characters cut; a param once logged may
    not change value: MLflow rejects that)."""
    items = [Param(_key(k), _param_value(v)) for k, v in params.items()]
    for chunk in _chunks(items, MAX_PARAMS_PER_BATCH):
        client().log_batch(run_id, params=chunk)


def log_config(run_id: str, cfg: Config) -> None:
    """The config three ways: flat params (``ppo.lr``...), the whole resolved YAML as
    ``config/config.yaml`` (nothing cut there), and the ``config_hash`` tag."""
    log_params(run_id, flatten(cfg))
    log_text(run_id, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), CONFIG_ARTIFACT)
    set_tags(run_id, {TAG_CONFIG_HASH: config_hash(cfg)})


def log_metrics(run_id: str, metrics: Mapping[str, float], step: int, prefix: str = "") -> None:
    """Log ``{prefix + key: value}`` at ``step`` in batches. Keys are sanitised; NaN/inf
    values are dropped with a warning and recorded as tag ``nonfinite/<key>``."""
    now = int(time.time() * 1000)
    good: list[Metric] = []
    bad: dict[str, float] = {}
    for k, v in metrics.items():
        key, value = _key(prefix + k), float(v)
        if math.isfinite(value):
            good.append(Metric(key, value, now, int(step)))
        else:
            bad[key] = value
    if bad:
        log.warning("run %s step %d: dropped non-finite metrics %s", run_id, step, bad)
        set_tags(run_id, {f"{TAG_NONFINITE}/{k}": f"{v} at step {step}" for k, v in bad.items()})
    for chunk in _chunks(good, MAX_METRICS_PER_BATCH):
        client().log_batch(run_id, metrics=chunk)


def run_metrics(run_id: str) -> dict[str, float]:
    """Latest value of every metric of a run."""
    return dict(client().get_run(run_id).data.metrics)


# -- artifacts -----------------------------------------------------------------------------------
def log_artifacts(run_id: str, *paths: str | Path, artifact_path: str | None = None) -> None:
    """Upload files and directories (a directory keeps its name: ``<artifact_path>/<dir name>/...``)."""
    c = client()
    for p in map(Path, paths):
        if p.is_dir():
            c.log_artifacts(run_id, str(p), "/".join(filter(None, [artifact_path, p.name])))
        elif p.is_file():
            c.log_artifact(run_id, str(p), artifact_path)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory to log to run {run_id}")


def log_text(run_id: str, text: str, artifact_file: str) -> None:
    """Write ``text`` as artifact ``artifact_file`` (e.g. ``"samples/trajectories_iter3.txt"``)."""
    client().log_text(run_id, text, artifact_file)


def log_plot(run_id: str, plot: "str | Path | Figure", artifact_file: str | None = None) -> None:
    """A matplotlib figure (saved as ``artifact_file``) or an image file (into ``plots/``)."""
    if isinstance(plot, (str, Path)):
        client().log_artifact(run_id, str(plot), "plots")
    else:
        client().log_figure(run_id, plot, artifact_file or "plots/figure.png")


# -- datasets ------------------------------------------------------------------------------------
def _read_sample(path: Path, rows: int) -> tuple[pd.DataFrame, int]:
    """The first ``rows`` rows of a JSONL or Parquet file (or Parquet directory), and the
    file's total row count."""
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            total = sum(1 for line in f if line.strip())
        return pd.read_json(path, lines=True, nrows=rows) if total else pd.DataFrame(), total
    if path.suffix == ".parquet" or path.is_dir():
        import pyarrow.dataset as ds

        data = ds.dataset(str(path), format="parquet")
        return data.head(rows).to_pandas(), data.count_rows()
    raise ValueError(f"{path}: cannot log as a dataset: expected a .jsonl or .parquet file or a Parquet directory")


def log_dataset(
    run_id: str,
    path: str | Path,
    name: str,
    context: str,
    digest: str | None = None,
    sample_rows: int = DATASET_SAMPLE_ROWS,
) -> None:
    """Record a JSONL/Parquet dataset as an input of the run (the run's "Datasets" panel).

    Schema and profile come from the first ``sample_rows`` rows; ``source`` is the path;
    ``digest`` is the DVC md5 when known, else MLflow hashes the sample. ``context`` is e.g.
    ``"train"``, ``"eval"``, ``"rollouts"``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: dataset '{name}' not found")
    sample, total = _read_sample(path, sample_rows)
    # MLflow registers its local source twice (so it warns that a path is ambiguous), hints
    # about integer columns, and trips a pandas deprecation in its digest code.
    with _quiet(".*can be interpreted in multiple ways", ".*Inferred schema contains integer", ".*keyword-only"):
        dataset = mlflow.data.from_pandas(sample, source=str(path.resolve()), name=name,
                                          digest=digest[:MAX_DIGEST_CHARS] if digest else None)
        entity = dataset._to_mlflow_entity()  # the schema is inferred here, lazily
    tags = [InputTag(MLFLOW_DATASET_CONTEXT, _cut(context, MAX_INPUT_TAG_CHARS)),
            InputTag("rows_total", str(total)), InputTag("rows_sampled", str(len(sample)))]
    client().log_inputs(run_id, [DatasetInput(entity, tags)])


# -- the agent model -----------------------------------------------------------------------------
def agent_config(cfg: Config) -> dict[str, Any]:
    """The agent model's ``model_config`` (``adapters/agent_model.py``): the sections of the run's
    own config that shape an episode (prompt, environment, reward, rollout engine), and the
    load-time options, unset. A default ``Config()`` here would silently differ from the
    trained prompt, hence no default."""
    sections = {k: v for k, v in cfg.model_dump(mode="json").items() if k in AGENT_SECTIONS}
    # Plug-in files travel as artifacts (PLUGIN_ARTIFACT*); the model imports those copies.
    sections["plugins"] = [p for p in cfg.plugins if not p.endswith(".py")]
    # MLflow also logs this dict as the run's params: ``device`` holds the run's own value (not
    # None, which would clash with the run's ``device`` param and drop the whole batch, warning).
    return {"config": sections, "corpus": None, "device": cfg.device, "trace_experiment": None}


def _requirements() -> list[str]:
    """Pinned versions of what the agent model imports, read locally (MLflow's inference
    would load the model in a subprocess). The project itself (``models``, ``agentr1``,
    ``tasks``) must be installed where the model is loaded."""
    return [f"{pkg}=={metadata.version(pkg)}" for pkg in MODEL_REQUIREMENTS]


def log_policy_model(run_id: str, model_dir: str | Path, cfg: Config, name: str = MODEL_NAME,
                     corpus: str | Path | None = None) -> str:
    """Log the agent of run ``run_id`` as a pyfunc model (``adapters/agent_model.py``, from code):
    the Hugging Face policy directory (weights, tokenizer, chat template, value head), the
    dataset's resources its tools read (every file beside ``corpus.jsonl`` in ``cfg.data.dir``, or
    in the directory of ``corpus``: the SQL world's database, a plug-in generator's files), the
    plug-in files and the files MCP servers' commands name (their scripts) as artifacts, and
    ``cfg``'s episode settings (:func:`agent_config`); returns its ``models:/<id>`` URI.

    ``cfg`` is the run's own config. A LoRA adapter directory is logged as is: its base model
    must be at the recorded path where the model is loaded.
    """
    from mlflow.models.signature import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import Array, Object, Property

    from agentr1.data.records import CORPUS_FILE, corpus_path, resource_files
    from agentr1.env.mcp import command_files
    from agentr1.env.registry import plugin_files

    model_dir = Path(model_dir)
    if not any((model_dir / f).is_file() for f in ("config.json", ADAPTER_CONFIG_FILE)):
        raise FileNotFoundError(f"{model_dir}: not a Hugging Face model directory "
                                f"(no config.json or {ADAPTER_CONFIG_FILE})")
    corpus = Path(corpus) if corpus is not None else corpus_path(cfg.data.dir)
    if not corpus.is_file():
        raise FileNotFoundError(f"{corpus}: the corpus the agent searches is missing")
    files = {f"{PLUGIN_ARTIFACT}{i}": str(p) for i, p in enumerate(plugin_files(cfg.plugins))}
    files.update({f"{MCP_ARTIFACT}{i}_{j}": str(p) for (i, j), p in command_files(cfg.env.mcp).items()})
    c = client()
    # Created here, not by Model.log: that would file it under the process's "current"
    # experiment rather than the run's.
    logged = c.create_logged_model(c.get_run(run_id).info.experiment_id, name=name, source_run_id=run_id)
    # The explicit signature replaces the input example MLflow asks for (an example would be
    # checked by loading the whole agent once more).
    # A question column, or one agent conversation (MLflow's Responses "input" or ChatAgent
    # "messages"): adapters/agent_model.py answers each in its own shape.
    messages = Array(Object([Property("role", "string"), Property("content", "string")]))
    signature = ModelSignature(inputs=Schema([ColSpec("string", QUESTION, required=False),
                                              ColSpec("string", FUNCTIONS, required=False),
                                              ColSpec(messages, RESPONSES_INPUT, required=False),
                                              ColSpec(messages, CHAT_MESSAGES, required=False)]),
                               params=ParamSchema([ParamSpec("temperature", "double", 0.0),
                                                   ParamSpec("seed", "long", 0)]))
    with _quiet(".*An input example was not provided", logger="mlflow.pyfunc"), \
            tempfile.TemporaryDirectory(prefix="agentr1-model-") as staging:
        # One directory of the resources, under their own names (the tools find them as in training).
        resources = Path(staging) / RESOURCES_ARTIFACT  # MLflow keeps a directory artifact's own name
        resources.mkdir()
        for path in [corpus, *(p for p in resource_files(corpus.parent) if p.name != CORPUS_FILE)]:
            shutil.copy2(path, resources / (CORPUS_FILE if path == corpus else path.name))
        files[RESOURCES_ARTIFACT] = str(resources)
        info = mlflow.models.Model.log(
            artifact_path=None, name=name, flavor=mlflow.pyfunc, run_id=run_id, model_id=logged.model_id,
            python_model=str(AGENT_MODEL_CODE),
            artifacts={POLICY_ARTIFACT: str(model_dir), **files},
            model_config=agent_config(cfg), pip_requirements=_requirements(), signature=signature,
        )
    return info.model_uri


# -- registry ------------------------------------------------------------------------------------
def register(model_uri: str, name: str = MODEL_NAME) -> str:
    """Register ``model_uri`` as a new version of ``name`` (created if new); returns the version."""
    client()  # point MLflow's global URI at our store first
    with store_lock():  # the model's creation and the next version number are read-then-write
        return str(mlflow.register_model(model_uri, name).version)


def set_champion(name: str, version: str | int) -> None:
    """Move the ``champion`` alias of ``name`` to ``version`` (unconditionally: to move it
    only when the challenger wins, see ``tasks.registry.promote_if_better``)."""
    client().set_registered_model_alias(name, CHAMPION, str(version))


def champion_entry(name: str = MODEL_NAME) -> ModelVersion | None:
    """The ``ModelVersion`` the ``champion`` alias of ``name`` points at; None when the model
    or the alias does not exist."""
    try:
        return client().get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"):
            raise
        return None


def champion(name: str = MODEL_NAME) -> tuple[str, dict[str, float]] | None:
    """``(version, latest metrics of the run that logged it)`` for the ``champion`` alias;
    None when the model or the alias does not exist."""
    version = champion_entry(name)
    if version is None:
        return None
    return str(version.version), run_metrics(version.run_id) if version.run_id else {}
