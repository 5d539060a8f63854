"""The process entry point (cli/__main__.py) ends the process after the last exit handler, with
the command's own exit status, and every handler registered during the command still runs."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentr1.errors import EXIT_BAD_INPUT, EXIT_OK

REPO = Path(__file__).resolve().parents[1]


def agentr1(*argv: str, code: str | None = None) -> subprocess.CompletedProcess:
    """``python -m cli *argv``, or ``code`` run first in the program's own ``__main__``."""
    cmd = [sys.executable, "-m", "cli", *argv] if code is None else [
        sys.executable, "-c", f"import sys; sys.argv[1:] = {list(argv)!r}; import cli.__main__ as entry\n{code}\nentry.run()"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=dict(os.environ), timeout=120)


@pytest.mark.parametrize(("argv", "status", "says"), [
    (["--help"], EXIT_OK, "usage: agentr1"),
    (["no-such-command"], EXIT_BAD_INPUT, "invalid choice"),
    (["train", "-o", "no_such.key=1"], EXIT_BAD_INPUT, "Extra inputs are not permitted"),
])
def test_the_commands_exit_status_and_output_reach_the_caller(argv, status, says):
    done = agentr1(*argv)
    assert done.returncode == status, done.stderr
    assert says in done.stdout + done.stderr


def test_a_handler_registered_during_the_command_runs_before_the_process_ends():
    """What Prefect's temporary server stop and MLflow's queue flush rely on."""
    done = agentr1("--help", code="import atexit; atexit.register(lambda: print('late handler ran', flush=True))")
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.rstrip().endswith("late handler ran")


def test_an_exception_that_escapes_exits_1_with_its_traceback():
    done = agentr1("--help", code="import cli.main; cli.main.main = lambda: 1 / 0")
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr


def test_a_system_exit_inside_a_command_keeps_its_code():
    done = agentr1(code="import cli.main\ndef main(): raise SystemExit(7)\ncli.main.main = main")
    assert done.returncode == 7, done.stderr


def test_a_users_module_named_like_one_of_ours_is_named_before_anything_runs(tmp_path):
    """A ``models.py`` in the working directory shadows this project's ``models`` package: the
    command says which name resolves where and exits 2, instead of failing deep inside."""
    (tmp_path / "models.py").write_text("raise RuntimeError('the user module must not even be imported')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # cli from this project; the working directory first on sys.path
    done = subprocess.run([sys.executable, "-m", "cli", "train", "-o", "seed=0"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert f"models -> {tmp_path / 'models.py'}" in done.stderr and "RuntimeError" not in done.stderr
    (tmp_path / "models.py").unlink()
    past = subprocess.run([sys.executable, "-m", "cli", "train", "-o", "no_such.key=1"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    assert "cannot read config conf/train.yaml" in past.stderr and "resolve elsewhere" not in past.stderr
