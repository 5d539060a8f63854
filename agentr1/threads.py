"""How this process's OpenMP threads wait for work, chosen once, before torch loads OpenMP.

torch's CPU build runs its intra-op thread pool on OpenMP (libgomp), whose threads spin at
every barrier before they sleep. On a machine whose cores other programs keep busy, a spinning
thread holds a core that its partner (descheduled mid-step) needs, and the default warm-up step
took 6-8x its idle time beside 4 busy processes on 2 cores; with ``OMP_WAIT_POLICY=PASSIVE``
(threads sleep at once) it took 2.5x, near the fair share of the cores (3x for 2 threads beside
4 processes). On an idle machine the same policy costs ~20% (each of the step's many small
parallel regions wakes a sleeping thread), so it is chosen by what the machine is doing when
the process starts (``benchmarks/threads.py`` measures every setting side by side).

The choice is made once per process tree: it is written into the environment, which child
processes (DVC stages, Prefect flow runs, ablation workers) inherit, and OpenMP reads only at
start. The thread *count* is left alone: it changes the floating-point rounding of every
reduction, so it is part of a run's identity (docs/design.md, Determinism); set it with
``OMP_NUM_THREADS``.

``AGENTR1_OMP_WAIT``: ``auto`` (default), ``passive``, ``default`` (OpenMP's own), or ``off``
(touch nothing). ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` set by the user always win.
"""
from __future__ import annotations

import os
import time

CHOICE_ENV = "AGENTR1_OMP_WAIT"
BUSY_CORES = 0.5
"""Cores the other programs must keep busy, at start, for the passive wait policy."""
SAMPLE_S = 0.1
"""How long the machine's CPU counters are watched at start."""


def busy_cores(sample_s: float = SAMPLE_S) -> float | None:
    """Cores that processes other than this one kept busy over ``sample_s`` seconds, from
    ``/proc/stat`` and ``/proc/self/stat``; None where those do not exist (not Linux)."""
    try:
        machine0, self0 = _machine_busy(), _self_busy()
        time.sleep(sample_s)
        machine1, self1 = _machine_busy(), _self_busy()
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((machine1 - machine0) - (self1 - self0)) / ticks / sample_s)


def _machine_busy() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal


def _self_busy() -> int:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def configure(environ: dict | None = None, busy: float | None = None) -> str:
    """Set the OpenMP wait policy in ``environ`` (``os.environ``) unless something already
    decided it; returns what was done: ``"passive"``, ``"default"``, ``"user"`` or ``"off"``.
    ``busy`` replaces the measurement (tests)."""
    env = os.environ if environ is None else environ
    choice = env.get(CHOICE_ENV, "auto").strip().lower()
    if choice == "off":
        return "off"
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return "user"
    if choice not in ("auto", "passive", "default"):
        raise ValueError(f"{CHOICE_ENV}={env[CHOICE_ENV]!r}: expected auto, passive, default or off")
    if choice == "auto":
        measured = busy_cores() if busy is None else busy
        choice = "passive" if measured is not None and measured >= BUSY_CORES else "default"
    # Recorded for the children either way, so a child started beside its busy parent does not
    # mistake the parent for another program.
    env[CHOICE_ENV] = choice
    if choice == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return choice
