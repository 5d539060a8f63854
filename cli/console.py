"""What every ``agentr1`` command does to the console: stdout kept for its one JSON document,
third-party chatter held back, the run's own progress on stderr."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from typing import Iterator


def print_json(obj: dict) -> None:
    print(json.dumps(obj, ensure_ascii=False, indent=2))


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While the body runs, whatever would go to stdout goes to stderr, so a command whose
    stdout is one JSON document (printed after the body) prints nothing else there.

    File descriptor 1 itself is pointed at stderr, not only ``sys.stdout``: log handlers
    bound to the stdout object (vLLM's), C extensions and child processes that inherit fd 1
    (DVC, vLLM's engine core) write to the descriptor.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()  # what handlers holding the stdout object buffered belongs to stderr too
        os.dup2(saved, 1)
        os.close(saved)


QUIET_LOGGERS = ("bm25s", "httpx", "urllib3", "filelock", "alembic", "mlflow")
"""Third-party loggers held at WARNING: their INFO lines (an index being built, each HTTP
request) are noise beside the run's own progress. vLLM's go to ERROR: its warnings are about
its own CPU build (missing Triton, tcmalloc, thread binding), nothing a user of this project acts on."""


def quiet_third_party() -> None:
    """Third-party chatter only when it matters: :data:`QUIET_LOGGERS` at WARNING, vLLM (its own
    handler too) at ERROR unless ``VLLM_LOGGING_LEVEL`` asks for more, transformers'
    weight-loading progress bars off."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")  # torch deprecations it trips
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is imported
    # mlflow sets its own logger's level when it is imported (after this, in a command that loads a
    # model): from this variable, else INFO ("Creating initial MLflow database tables...").
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # Read at import by huggingface_hub, so the flows' worker processes inherit it too.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def setup_logging() -> None:
    """The run's own progress (INFO) on stderr, third-party chatter quiet."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    quiet_third_party()
