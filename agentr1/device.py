"""What this machine is and how this process uses it: the device a run trains on, whether it
computes in bf16 natively, the CPU's model, and how OpenMP threads wait. The one home of device
facts; it imports torch only inside the functions that need a device, so the wait policy can be
set before anything loads OpenMP.

**OpenMP wait policy**, set once, before torch loads OpenMP (:func:`configure_threads`, which
``import agentr1`` calls). torch's CPU build runs its intra-op thread pool on libgomp, whose
threads spin at every barrier before they sleep. Beside other busy programs a spinning thread
holds a core its descheduled partner needs, and OpenMP reads its wait policy only when it starts,
so a process cannot change its mind when the load changes. ``benchmarks/threads.py`` measured the
default warm-up's step on 2 cores (docs/benchmarks.md, 2026-12-07), with 4 busy processes there
from the start and arriving 1 s into the run: OpenMP's default wait 28x and 17x its idle step,
``OMP_WAIT_POLICY=PASSIVE`` 5.9x and 3.7x, ``GOMP_SPINCOUNT=1000`` 5.6x and 4.6x; idle, the
passive policy costs ~20% (0.433 s against 0.357 s). Deciding from the load at start (this
module's earlier default) spun for good when the load came later (14x). So the default is
**passive**: ~20% slower on a quiet machine, 4-5x faster than OpenMP's own wait whenever
something else runs. The choice is written into the environment, which child processes inherit. The thread
*count* is left alone: it changes the rounding of every reduction, so it is part of a run's
identity (docs/design.md, Determinism); set it with ``OMP_NUM_THREADS``.

``AGENTR1_OMP_WAIT``: ``passive`` (default), ``auto`` (passive when other programs kept >= 0.5
core busy as the process started, else OpenMP's own: for a machine nothing else will use),
``default`` (OpenMP's own), or ``off`` (touch nothing). ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
set by the user always win.
"""
from __future__ import annotations

import functools
import os
import platform
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CHOICE_ENV = "AGENTR1_OMP_WAIT"
DEFAULT_CHOICE = "passive"
BUSY_CORES = 0.5
"""``auto``: cores the other programs must keep busy, at start, for the passive wait policy."""
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


def configure_threads(environ: dict | None = None, busy: float | None = None) -> str:
    """Set the OpenMP wait policy in ``environ`` (``os.environ``) unless something already
    decided it; returns what was done: ``"passive"``, ``"default"``, ``"user"`` or ``"off"``.
    ``busy`` replaces the measurement (tests)."""
    env = os.environ if environ is None else environ
    choice = env.get(CHOICE_ENV, DEFAULT_CHOICE).strip().lower()
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


def cpuinfo_field(name: str, cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str | None:
    """The first value of ``name`` in ``/proc/cpuinfo`` (``flags``, ``model name``), stripped;
    None where the file or the field is not there (not Linux)."""
    try:
        with open(cpuinfo, errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


@functools.cache
def cpu_model() -> str:
    """This machine's CPU model (Linux: ``/proc/cpuinfo``), else what ``platform`` knows; read once."""
    return cpuinfo_field("model name") or platform.processor() or platform.machine() or "unknown"


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively: a CUDA GPU that supports it, or a CPU with AMX
    or AVX-512 BF16 (Linux: /proc/cpuinfo). Elsewhere bf16 is emulated and slower than fp32 (an
    AMD EPYC without AVX-512 took minutes for what fp32 does in seconds)."""
    if device.type == "cuda":
        import torch

        return torch.cuda.is_bf16_supported()
    return bool({"amx_bf16", "avx512_bf16"} & set((cpuinfo_field("flags") or "").split()))


def resolve_device(setting: str) -> torch.device:
    """The config's ``device`` as a torch device: ``auto`` is the GPU where there is one."""
    import torch

    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)
