"""The default warm-up's training step on an idle and on a loaded machine, per threading setting.

Why: torch's CPU build runs its intra-op thread pool on OpenMP (libgomp), whose threads spin at
every barrier. When other programs keep the cores busy, a spinning thread holds a core its
partner needs, and a 2-thread step slowed ~10x on a machine at load ~7 (issue 30). The setting
chosen here is applied by ``agentr1/device.py`` where every process starts.

Each measurement runs in a fresh process (OpenMP reads its environment when torch loads it),
side by side in one run: for each load (``--loads``: 0 and 4 busy-loop processes that this script
starts and stops itself) and each setting, the median of ``--steps`` warm-up demonstration steps
(forward, loss on action tokens, backward, clip, Muon step) of the default run's model
(``conf/train.yaml``) on 32 episodes shaped like the default run's. Usage::

    python benchmarks/threads.py [--loads 0 4] [--steps 12]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import warmup_step  # the sibling script: `python benchmarks/threads.py` puts benchmarks/ on sys.path


# name -> environment changes (None removes the variable). "agentr1 default" is what every agentr1
# process gets from agentr1/device.py (so its row is measured through that module).
def _setting(threads: str | None, wait: str | None = None, spin: str | None = None,
             agentr1: str | None = "off") -> dict[str, str | None]:
    return {"OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": wait, "GOMP_SPINCOUNT": spin, "AGENTR1_OMP_WAIT": agentr1}


SETTINGS: dict[str, dict[str, str | None]] = {
    "2 threads, OpenMP's default wait": _setting("2"),
    "2 threads, OMP_WAIT_POLICY=PASSIVE": _setting("2", wait="PASSIVE"),
    "2 threads, GOMP_SPINCOUNT=1000": _setting("2", spin="1000"),
    "2 threads, GOMP_SPINCOUNT=3000": _setting("2", spin="3000"),
    "2 threads, GOMP_SPINCOUNT=10000": _setting("2", spin="10000"),
    "1 thread": _setting("1"),
    "agentr1 default (agentr1/device.py)": _setting(None, agentr1=None),
}


DEFAULT_SETTINGS = ["2 threads, OpenMP's default wait", "2 threads, OMP_WAIT_POLICY=PASSIVE", "1 thread",
                    "agentr1 default (agentr1/device.py)"]


def _busy(niceness: int) -> None:
    os.nice(niceness)
    while True:
        pass


def parse_load(text: str) -> tuple[int, int]:
    """``"4"`` -> 4 busy processes at this process's priority; ``"4@19"`` -> 4 at nice 19."""
    n, _, nice = text.partition("@")
    return int(n), int(nice or 0)


def measure(env_changes: dict[str, str | None], steps: int) -> dict:
    """The warm-up step (``warmup_step.child``, eager) in a fresh process with ``env_changes``."""
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return warmup_step.measure("eager", steps, 2, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", nargs="+", default=["0", "4", "4@19"],
                    help="busy-loop processes to run beside: N, or N@NICE for N processes at that niceness")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per measurement (after 2 untimed)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the settings, interleaved")
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=DEFAULT_SETTINGS, metavar="NAME",
                    help=f"which settings to measure, of: {'; '.join(SETTINGS)} (default: {'; '.join(DEFAULT_SETTINGS)})")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before the run", flush=True)
    rows, names, threads = [], args.settings, {}
    for load in args.loads:
        n_busy, niceness = parse_load(load)
        busy = [mp.Process(target=_busy, args=(niceness,), daemon=True) for _ in range(n_busy)]
        for p in busy:
            p.start()
        time.sleep(1.0 if n_busy else 0.0)
        try:
            times: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.repeats):  # rounds interleave the settings: drift hits all alike
                for name in names:
                    res = measure(SETTINGS[name], args.steps)
                    times[name] += res["times"]
                    threads[name] = res["threads"]
            for name in names:
                med = statistics.median(times[name])
                rows.append((load, name, threads[name], med))
                print(f"load {load}: {name}: {threads[name]} torch threads, median step {med:.3f} s", flush=True)
        finally:
            for p in busy:
                p.terminate()
            for p in busy:
                p.join()
    idle = {name: med for load, name, _, med in rows if parse_load(load)[0] == 0}
    print("\n| busy processes (@nice) | setting | torch threads | median step (s) | x idle, same setting |")
    print("|---:|---|---:|---:|---:|")
    for load, name, threads, med in rows:
        ratio = f"{med / idle[name]:.2f}" if name in idle else "-"
        print(f"| {load} | {name} | {threads} | {med:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
