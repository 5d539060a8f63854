"""Session-wide test environment: no analytics, no network, everything in temp dirs; the one
temporary Prefect server every flow test shares; and the small synthetic world (environment,
tokenizer, chat format) both rollout backends' tests play in."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_TMP = tempfile.mkdtemp(prefix="agentr1-tests-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # each test process's stores and caches
_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_HOME": os.path.join(_TMP, "prefect"),
    "MLFLOW_TRACKING_URI": f"sqlite:///{os.path.join(_TMP, 'mlflow.db')}",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "AGENTR1_CACHE": os.path.join(_TMP, "cache"),
    "HYPOTHESIS_STORAGE_DIRECTORY": os.path.join(_TMP, "hypothesis"),  # not ./.hypothesis
}
os.environ.update(_ENV)
# One torch thread in every test process (pytest-xdist's workers: `make test` runs two) and in
# what they start, before torch is imported: two workers then fill two cores, where their two
# threads each would spin-wait on each other's cores (agentr1/device.py). A value set outside
# the suite wins; tests that compare thread counts set theirs.
os.environ.setdefault("OMP_NUM_THREADS", "1")

SERVER_STARTUP_S = 120
REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the repository stays as it was


def _repo_entries() -> set[str] | None:
    """What git shows in the repository beside its clean tracked files (changed, untracked and
    ignored paths, a new folder as one entry), bytecode and pytest's cache left out; None where
    git cannot say (no git, not a clone)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored=matching", "--untracked-files=normal"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {line[3:] for line in out.stdout.splitlines() if "__pycache__" not in line and ".pytest_cache" not in line}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or the one process), not an xdist worker
        session.config.stash[_BEFORE] = _repo_entries()


def pytest_sessionfinish(session, exitstatus):
    """A test that writes into the repository (an MLflow store in ./mlruns, a cache, a changed
    tracked file) fails the session, naming what appeared: tests write into temp dirs only."""
    before = session.config.stash.get(_BEFORE, None)
    after = _repo_entries() if before is not None else None
    if after is None or not (new := sorted(after - before)):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(f"the tests wrote into the repository {REPO}: {', '.join(new)}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set | None]()


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect server (SQLite in a temp dir) for every flow test."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=SERVER_STARTUP_S):
        yield


@pytest.fixture(scope="session")
def rollout_world(tmp_path_factory) -> dict:
    """A 69-question synthetic world with its search environment, a 600-token tokenizer
    trained on it and the chat format: everything a rollout needs but the model."""
    from agentr1.env.qa import synth
    from agentr1.config import EnvConfig, RewardConfig
    from agentr1.env.qa.env import EnvSettings, QAEnv
    from agentr1.env.rewards import RewardWeights
    from agentr1.env.qa.search import SearchIndex
    from models.chat import ChatFormat
    from models.tokenizer import build_tokenizer

    splits, corpus = synth.generate(3, n_train=40, n_dev=5, n_test=24)
    search = SearchIndex.build(corpus, cache_dir=tmp_path_factory.mktemp("idx"))
    env = QAEnv(search, EnvSettings.from_config(EnvConfig(top_k=1, max_turns=4, system_prompt="", doc_header=True)),
                RewardWeights.from_config(RewardConfig()))
    texts = [f"{d.title}\n{d.text}" for d in corpus] + [r.question for r in splits["train"]]
    texts += ['<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'] * 50
    tok = build_tokenizer(texts, vocab_size=600)
    return {"splits": splits, "env": env, "tok": tok, "chat": ChatFormat(tok, None)}


@pytest.fixture
def registry_restored():
    """The environment/tool registry and the loaded plug-in modules as they were before the test:
    a plug-in's registrations would outlive it, and a later test that expects its kind to be
    unknown (or loads it again, which a cached module skips) would see them."""
    import sys

    from agentr1.env import registry

    envs, tools, modules = dict(registry._ENVS), dict(registry._TOOLS), set(sys.modules)
    yield
    registry._ENVS.clear()
    registry._ENVS.update(envs)
    registry._TOOLS.clear()
    registry._TOOLS.update(tools)
    for name in set(sys.modules) - modules:
        if name.startswith("agentr1_plugin_"):
            del sys.modules[name]
