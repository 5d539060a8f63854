"""The default console: third-party progress bars stay off in worker processes as well."""
import os
import subprocess
import sys

from cli.console import quiet_third_party


def child_shows_bars() -> bool:
    code = "from transformers.utils import logging; print(logging.is_progress_bar_enabled())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True).stdout.strip()
    return out == "True"


def test_quiet_console_reaches_child_processes(monkeypatch):
    # The ablation's runs and the data-parallel ranks are fresh processes: transformers' weight
    # loading/saving bars ("Loading weights", "Writing model shards") must be off there too.
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert child_shows_bars()  # the control: a child left alone shows them
    quiet_third_party()
    assert not child_shows_bars()
