"""Session-wide test environment: no analytics, no network, everything in temp dirs; and the
one temporary Prefect server every flow test shares."""
from __future__ import annotations

import os
import tempfile

import pytest

_TMP = tempfile.mkdtemp(prefix="agentr1-tests-")
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
}
os.environ.update(_ENV)

SERVER_STARTUP_S = 120


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect server (SQLite in a temp dir) for every flow test."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=SERVER_STARTUP_S):
        yield
