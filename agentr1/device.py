"""What this machine is and how this process uses it: the device a run trains on, whether it
computes in bf16 natively, the CPU's model, and how OpenMP threads wait. The one home of device
facts; it imports torch only inside the functions that need a device, so the wait policy can be
set before anything loads OpenMP.

**Threads under load.** torch's CPU build runs its intra-op thread pool on libgomp, whose
threads spin at every barrier before they sleep; OpenMP reads its wait policy once, when it
starts. Beside other busy programs a spinning thread holds a core its descheduled partner needs,
and even a sleeping one waits at each barrier for whichever thread the scheduler has just put
behind another program. :func:`configure_threads` (``AGENTR1_OMP_WAIT``, before torch loads
OpenMP) picks one of:

- ``passive`` (default): OpenMP's passive wait, the thread count fixed.
- ``adapt``: OpenMP's own spinning wait, and :class:`ThreadGovernor` re-deciding the torch thread
  count at step boundaries every 2 s (the cores the other programs leave free, at least 1; the
  whole count back when they stop), since one thread spins at no barrier. Passive instead where
  ``OMP_NUM_THREADS`` fixes the count.
- ``default`` (OpenMP's own, nothing adapts), ``auto`` (passive when other programs kept >= 0.5
  core busy as the process started, else OpenMP's own), ``off`` (touch nothing).

``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` set by the user always win; the choice is written into
the environment, which child processes inherit. ``benchmarks/threads.py``, the default
warm-up stage (150 steps) on this project's 2-core AMD EPYC VM, 2026-12-07 (docs/benchmarks.md):
idle, OpenMP's own wait 71 s, ``adapt`` 61-64 s, ``passive`` 85-91 s; beside 4 busy processes,
there from the start or arriving 20 s in, ``passive`` 209-211 s (2.5x its idle time), ``adapt``
241-248 s (3.9-4.1x; 1 thread), OpenMP's own wait ~8x (its step). Neither holds both ends, so the
default stays the one that degrades least; on SmolLM2 (few, large parallel regions) ``passive``
costs nothing idle. A thread count that changes changes a run's rounding (docs/design.md,
Determinism): ``adapt`` logs and records (``perf/threads``) each change.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger("agentr1.train")
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
    return _others_cores(machine1 - machine0, self1 - self0, sample_s)


def _others_cores(machine_ticks: int, own_ticks: int, seconds: float) -> float:
    """Cores the other programs kept busy: the machine's busy ticks less one's own, per second."""
    return max(0.0, (machine_ticks - own_ticks) / os.sysconf("SC_CLK_TCK") / seconds)


def _machine_busy() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal


def _stat_fields(pid: int | str = "self") -> list[str]:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses): field
    0 is the state, 1 the parent's pid, 11-14 utime stime cutime cstime."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _self_busy() -> int:
    fields = _stat_fields()
    return int(fields[11]) + int(fields[12])  # utime + stime


def configure_threads(environ: dict | None = None, busy: float | None = None) -> str:
    """Set the OpenMP wait policy in ``environ`` (``os.environ``) unless something already
    decided it; returns what was done: ``"passive"``, ``"adapt"``, ``"default"``, ``"user"`` or
    ``"off"``. ``adapt`` is OpenMP's own wait with the thread count adapting to the load
    (:class:`ThreadGovernor`), or passive where ``OMP_NUM_THREADS`` fixes the count.
    ``busy`` replaces the measurement (tests)."""
    env = os.environ if environ is None else environ
    choice = env.get(CHOICE_ENV, DEFAULT_CHOICE).strip().lower()
    if choice == "off":
        return "off"
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return "user"
    if choice not in ("adapt", "auto", "passive", "default"):
        raise ValueError(f"{CHOICE_ENV}={env[CHOICE_ENV]!r}: expected adapt, auto, passive, default or off")
    if choice == "adapt" and "OMP_NUM_THREADS" in env:  # a fixed count: nothing takes a spinning thread away
        choice = "passive"
    elif choice == "auto":
        measured = busy_cores() if busy is None else busy
        choice = "passive" if measured is not None and measured >= BUSY_CORES else "default"
    # Recorded for the children either way, so a child started beside its busy parent does not
    # mistake the parent for another program.
    env[CHOICE_ENV] = choice
    if choice == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return choice


GOVERN_WINDOW_S = 2.0
"""How often (at a step boundary) the governor looks at what the other programs did."""
_pinned = "OMP_NUM_THREADS" in os.environ  # read before anything sets it: the user's own count
_start_threads: int | None = None
"""The torch thread count when the first governor started: the most any governor gives back (the
warm-up's may leave the count lowered for the PPO loop's, in the same process)."""


def pin_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for good: the governor leaves this process's count alone."""
    import torch

    global _pinned
    _pinned = True
    torch.set_num_threads(n)


def _family_busy() -> int:
    """CPU ticks of this process and every live descendant (its vLLM engine, its Prefect server),
    each with its reaped children's: work this run does itself, which is no reason to yield."""
    me, children, ticks = os.getpid(), {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat_fields(name)
        except OSError:  # gone since the listing
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [me]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def _others_busy_sample() -> tuple[float, int, int] | None:
    try:
        return time.monotonic(), _machine_busy(), _family_busy()
    except (OSError, ValueError, IndexError):
        return None


class ThreadGovernor:
    """Fewer torch threads while other programs keep the cores busy, the full count back when they
    stop; asked at step boundaries (:meth:`step`), it looks every ``window_s`` seconds.

    Why: on 2 cores beside busy programs a 2-thread step waits at every barrier for whichever of
    its threads the scheduler has just put behind one, and with OpenMP's own wait its spinning
    thread holds the core its partner needs: the default warm-up's step took 8x its idle time
    beside 4 busy loops, 3x beside one (docs/benchmarks.md). One thread waits at no barrier. The
    target is the cores the other programs leave free, ``round(cores - others)``, between 1 and
    the count when the first governor started; "others" is the machine's busy time
    (``/proc/stat``) less this process's and its descendants' (a scan of ``/proc``).

    On only with ``AGENTR1_OMP_WAIT=adapt`` (OpenMP's spinning wait, which needs it), off where
    ``OMP_NUM_THREADS`` or :func:`pin_threads` fix the count. The thread count changes the
    rounding of every reduction (docs/design.md, Determinism), so a run that adapted is not
    bit-identical to an idle run of the same config: each change is logged and counted
    (:attr:`changes`, ``perf/threads``). ``sample`` replaces ``/proc`` (tests)."""

    def __init__(self, window_s: float = GOVERN_WINDOW_S, sample=_others_busy_sample, enabled: bool | None = None):
        import torch

        global _start_threads
        self._torch, self.window_s, self._sample = torch, window_s, sample
        if _start_threads is None:
            _start_threads = torch.get_num_threads()
        self.max_threads = _start_threads
        adapt = os.environ.get(CHOICE_ENV) == "adapt"  # as configure_threads resolved it
        self.enabled = (adapt and not _pinned) if enabled is None else enabled
        self.enabled = self.enabled and self.max_threads > 1
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.changes = 0
        self._last = sample() if self.enabled else None

    @property
    def threads(self) -> int:
        return self._torch.get_num_threads()

    def step(self) -> int:
        """At a step boundary: the thread count for the next step (changed if the window is over
        and the other programs' load says so)."""
        if self._last is None:
            return self.threads
        now = self._sample()
        if now is None or now[0] - self._last[0] < self.window_s:
            return self.threads
        (t0, machine0, family0), (t1, machine1, family1) = self._last, now
        self._last = now
        others = _others_cores(machine1 - machine0, family1 - family0, t1 - t0)
        target = max(1, min(self.max_threads, round(self.cores - others)))
        current = self.threads
        if target != current:
            self._torch.set_num_threads(target)
            self.changes += 1
            log.info("torch threads %d -> %d: other programs kept %.1f of %d cores busy (%s=adapt; "
                     "OMP_NUM_THREADS keeps the count, and with it the run's rounding, fixed)",
                     current, target, others, self.cores, CHOICE_ENV)
        return target


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
