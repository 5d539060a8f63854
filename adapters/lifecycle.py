"""The life of an MLflow run: started with its owner, commit and machine recorded, ended FINISHED,
FAILED or KILLED whatever ends it (an exception, Ctrl-C, SIGTERM, ``sys.exit``), and a run whose
process died without ending it (``kill -9``, out of memory, power loss) ended KILLED by the next
start in its experiment.

A run records the process that owns it (pid, host, the process's start time), so a pid reused by
a later process is not taken for the owner. The store, its lock and the signals held around its
writes are :mod:`adapters.tracking`'s.
"""
from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_PARENT_RUN_ID, MLFLOW_USER

from adapters import tracking
from agentr1 import device, errors

log = logging.getLogger(__name__)

SYSTEM_METRICS_INTERVAL_S = 10.0


def git_commit(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of ``cwd`` (default: the current directory); None outside a repo."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else None


def git_dirty(cwd: str | Path | None = None) -> bool | None:
    """Whether tracked files of ``cwd``'s repository differ from its HEAD (a number made then
    is not reproducible from the commit alone); None outside a repo."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


@contextmanager
def start_run(
    experiment: str,
    run_name: str,
    tags: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
    system_metrics_interval: float | None = None,
) -> Iterator[str]:
    """Create a run in ``experiment`` (a name), yield its id, and end it FINISHED (FAILED on
    an exception, KILLED when interrupted: Ctrl-C, SIGTERM, ``sys.exit``).

    ``parent_run_id`` nests the run under that run (works from any thread: no active-run
    state). ``system_metrics_interval`` (seconds) samples CPU/memory/GPU metrics while the
    run is open; None leaves them off. Runs of ``experiment`` left RUNNING by a dead process
    on this host are ended KILLED first (:func:`end_orphaned_runs`).
    """
    c = tracking.client()
    exp_id = tracking.experiment_id(experiment)
    end_orphaned_runs(experiment)
    dirty = git_dirty(tracking.CODE_DIR)
    run_tags = tracking.clean_tags({MLFLOW_USER: _user(), MLFLOW_GIT_COMMIT: git_commit(tracking.CODE_DIR),
                      tracking.TAG_GIT_DIRTY: None if dirty is None else str(dirty).lower(), tracking.TAG_CPU: device.cpu_model(), **(tags or {}),
                      **_owner_tags(), MLFLOW_PARENT_RUN_ID: parent_run_id})
    run_id = c.create_run(exp_id, tags=run_tags, run_name=run_name).info.run_id
    monitor = system_metrics(run_id, system_metrics_interval) if system_metrics_interval else None
    status = RunStatus.to_string(RunStatus.FAILED)
    try:
        with _sigterm_unwinds():
            yield run_id
        status = RunStatus.to_string(RunStatus.FINISHED)
    except BaseException as exc:
        if errors.interruption(exc) is not None:  # Ctrl-C, SIGTERM, Prefect's TerminationSignal, sys.exit
            status = RunStatus.to_string(RunStatus.KILLED)
        raise
    finally:
        if monitor is not None:
            _finish_monitor(monitor, status)
        _set_terminated(c, run_id, status)


MONITOR_STOP_S = 10.0
"""How long an interrupted run waits for its system-metrics thread: a signal raised in the main
thread while it held the logging module's lock leaves that thread blocked for good, and MLflow's
``finish()`` joins it without a timeout (seen as a hang after SIGTERM)."""


def _finish_monitor(monitor, status: str) -> None:
    if status != RunStatus.to_string(RunStatus.KILLED):
        monitor.finish()
        return
    stopper = threading.Thread(target=monitor.finish, name="agentr1-stop-system-metrics", daemon=True)
    stopper.start()
    stopper.join(MONITOR_STOP_S)


def _set_terminated(c: MlflowClient, run_id: str, status: str, attempts: int = 5) -> None:
    """End the run, retrying while SQLite says another writer holds the database (the metrics
    thread's last write, racing an interrupted run's end)."""
    for attempt in range(attempts):
        try:
            c.set_terminated(run_id, status)
            return
        except MlflowException as exc:
            if "database is locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM while a run is open (exit status 128 + 15)."""


def _raise_terminated(signum: int, frame) -> None:
    raise Terminated(128 + signum)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Make SIGTERM raise :class:`Terminated` in the main thread while the body runs.

    SIGTERM's default action ends the process on the spot, so no ``finally`` runs and the
    run would stay RUNNING; an exception unwinds through :func:`start_run`, which ends it
    KILLED. Ctrl-C already raises KeyboardInterrupt. Only when SIGTERM has its default
    action: Prefect's flow engine installs a handler of its own that raises the same way
    (``TerminationSignal``), and an ignored SIGTERM stays ignored. A handler can only be set
    from the main thread; a run opened in a worker thread is ended by the next start's
    sweep (:func:`end_orphaned_runs`) if the process dies."""
    mine = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    if mine:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if mine and signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _process_started(pid: int) -> str | None:
    """When process ``pid`` started (psutil's create time); None without psutil or such a process."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def _owner_tags() -> dict[str, Any]:
    pid = os.getpid()
    return {tracking.TAG_PID: pid, tracking.TAG_HOST: socket.gethostname(), tracking.TAG_PROCESS_STARTED: _process_started(pid)}


START_TOLERANCE_S = 1.0
"""How far a process's start time may read from the one recorded and still be the same process:
psutil derives it from the boot time, which the kernel reports anew after a clock adjustment,
so an exact match to 0.01 s took a live run for an orphan and ended it. A new process that
reused the pid started later than this."""


def _same_start(now: float, recorded: str) -> bool:
    try:
        return abs(now - float(recorded)) < START_TOLERANCE_S
    except ValueError:  # not a number: not the process that wrote it
        return False


def _process_alive(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` (on this host) still runs and is the one that started at
    ``started`` (a zombie, or a new process that got the same pid, is not)."""
    try:
        import psutil
    except ImportError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            pass
        return True
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or _same_start(proc.create_time(), started)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def end_orphaned_runs(experiment: str) -> list[str]:
    """End KILLED the runs of ``experiment`` that are RUNNING although the process on this
    host that started them is gone (killed with SIGKILL, out of memory, power cut: nothing
    in the process could end them). Runs of other hosts, and runs without an owner tag, are
    left alone: nothing here can tell whether they still run. Returns the ids ended."""
    c = tracking.client()
    host = socket.gethostname()
    query = f"attributes.status = 'RUNNING' and tags.`{tracking.TAG_HOST}` = '{host}'"
    ended = []
    for run in c.search_runs([tracking.experiment_id(experiment)], query, max_results=tracking.SEARCH_MAX_RESULTS):
        tags = run.data.tags
        try:
            pid = int(tags[tracking.TAG_PID])
        except (KeyError, ValueError):
            continue
        if _process_alive(pid, tags.get(tracking.TAG_PROCESS_STARTED)):
            continue
        c.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))
        tracking.set_tags(run.info.run_id, {tracking.TAG_ENDED_BY: f"a later start: its process {pid} on {host} was gone"})
        log.warning("run %s (%s) was left RUNNING by process %d, which is gone: ended KILLED",
                    run.info.run_id, run.info.run_name, pid)
        ended.append(run.info.run_id)
    return ended


def flow_runs_of_orphaned_runs(experiment: str, limit: int = 50) -> list[str]:
    """The Prefect flow runs (``tracking.TAG_PREFECT_FLOW_RUN``) of the most recent runs of ``experiment``
    that :func:`end_orphaned_runs` ended: their flow runs died with their process too, and
    Prefect still shows them Running (``flows.pipeline.crash_orphaned_flow_runs`` ends them)."""
    query = (f"attributes.status = 'KILLED' and tags.`{tracking.TAG_ENDED_BY}` LIKE '%' "
             f"and tags.`{tracking.TAG_PREFECT_FLOW_RUN}` LIKE '%'")
    runs = tracking.client().search_runs([tracking.experiment_id(experiment)], query, max_results=limit,
                                order_by=["attributes.start_time DESC"])
    return [r.data.tags[tracking.TAG_PREFECT_FLOW_RUN] for r in runs]


def mark_diverged(run_id: str, reason: str) -> None:
    """Tag run ``run_id`` as diverged (``reason``: what went non-finite, where); registration
    refuses a policy from such a run."""
    tracking.set_tags(run_id, {tracking.TAG_DIVERGED: reason})


def diverged(run_id: str) -> str | None:
    """Why run ``run_id`` was marked diverged; None when it was not."""
    return tracking.client().get_run(run_id).data.tags.get(tracking.TAG_DIVERGED)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "unknown"


def system_metrics(run_id: str, interval_s: float = SYSTEM_METRICS_INTERVAL_S):
    """Start MLflow's system-metrics sampler (``system/cpu_utilization_percentage``, memory,
    disk, network; GPU when pynvml finds one) on ``run_id``; returns it (call ``.finish()``),
    or None when psutil is missing. ``start_run(..., system_metrics_interval=s)`` does this."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError as exc:  # psutil not installed
        log.warning("system metrics off: %s", exc)
        return None
    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1,
                                   tracking_uri=tracking.tracking_uri())
    monitor.start()
    return monitor
