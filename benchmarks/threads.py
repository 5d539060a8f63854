"""The default warm-up's training step on an idle and on a loaded machine, per threading setting.

Why: torch's CPU build runs its intra-op thread pool on OpenMP (libgomp), whose threads spin at
every barrier. When other programs keep the cores busy, a spinning thread holds a core its
partner needs, and a 2-thread step slowed ~10x on a machine at load ~7 (issue 30). The setting
chosen here is applied by ``agentr1/device.py`` where every process starts.

Each measurement runs in a fresh process (OpenMP reads its environment when torch loads it),
side by side in one run: for each load (``--loads``: 0 and 4 busy-loop processes that this script
starts and stops itself) and each setting, the median of ``--steps`` warm-up demonstration steps
(forward, loss on action tokens, backward, clip, Muon step) of the default run's model
(``conf/train.yaml``) on 32 episodes shaped like the default run's. A load written ``4+1``
arrives mid-run: its processes start 1 s after the measured process, which by then has chosen its
wait policy on an idle machine (what a run meets when a second job starts beside it).

The thread governor's setting (``AGENTR1_OMP_WAIT=adapt``: OpenMP's own wait, and
``agentr1.device.ThreadGovernor`` taking the process from 2 torch threads to 1 while other
programs keep the cores busy) says how many changes a measurement made. ``--stage-steps N`` times the whole ``agentr1 train --stage
warmup`` of the default config (N steps) instead of single steps: with a load like ``4+20`` the
loops arrive 20 s into the stage, in the middle of its steps. Usage::

    python benchmarks/threads.py [--loads 0 4 4+1] [--steps 12]
    python benchmarks/threads.py --stage-steps 150 --loads 0 4 4+20 --repeats 1
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import warmup_step  # noqa: E402  the sibling script: `python benchmarks/threads.py` puts benchmarks/ on sys.path


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
    "OpenMP's default wait + thread governor (AGENTR1_OMP_WAIT=adapt)": _setting(None, agentr1="adapt"),
}


DEFAULT_SETTINGS = ["2 threads, OpenMP's default wait", "2 threads, OMP_WAIT_POLICY=PASSIVE", "1 thread",
                    "agentr1 default (agentr1/device.py)"]


def _busy(niceness: int) -> None:
    os.nice(niceness)
    while True:
        pass


def parse_load(text: str) -> tuple[int, int, float | None]:
    """``"4"`` -> 4 busy processes at this process's priority, there before each measurement
    starts; ``"4@19"`` -> 4 at nice 19; ``"4+1"`` -> 4 that start 1 s into each measurement."""
    text, _, after = text.partition("+")
    n, _, nice = text.partition("@")
    return int(n), int(nice or 0), float(after) if after else None


def start_busy(n: int, niceness: int) -> list[mp.Process]:
    busy = [mp.Process(target=_busy, args=(niceness,), daemon=True) for _ in range(n)]
    for p in busy:
        p.start()
    return busy


def stop_busy(busy: list[mp.Process]) -> None:
    for p in busy:
        p.terminate()
    for p in busy:
        p.join()


def _environment(env_changes: dict[str, str | None]) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _beside(run, arriving: tuple[int, int, float] | None):
    """``run()`` with ``arriving`` = (processes, niceness, seconds): busy loops that start that long after it."""
    late: list[mp.Process] = []
    timer = threading.Timer(arriving[2], lambda: late.extend(start_busy(*arriving[:2]))) if arriving else None
    if timer:
        timer.start()
    try:
        return run()
    finally:
        if timer:
            timer.cancel()
            timer.join()
        stop_busy(late)


def measure(env_changes: dict[str, str | None], steps: int, arriving: tuple[int, int, float] | None = None) -> dict:
    """The warm-up step (``warmup_step.child``, eager) in a fresh process with ``env_changes``."""
    return _beside(lambda: warmup_step.measure("eager", steps, 2, _environment(env_changes)), arriving)


def measure_stage(env_changes: dict[str, str | None], steps: int, arriving: tuple[int, int, float] | None = None) -> dict:
    """``agentr1 train --stage warmup`` of the default config with ``steps`` demonstration steps (no
    corpus steps), in a fresh process with ``env_changes``: its "warm-up done in" seconds (playing
    the demonstrations, building the model, the steps, the value fit) and its thread changes. The
    process is stopped at that line (the stage would go on to evaluate the warm-up)."""
    with tempfile.TemporaryDirectory(prefix="agentr1-threads-") as tmp:
        env = _environment(env_changes)
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        cmd = [sys.executable, "-m", "cli", "train", "--stage", "warmup", "-o", f"sft.steps={steps}",
               "-o", "sft.corpus_steps=0", "-o", f"output_dir={tmp}/run"]

        def run() -> list[str]:
            lines = []
            with subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True) as proc:
                for line in proc.stderr:
                    lines.append(line)
                    if "warm-up done in" in line:
                        proc.terminate()
                        break
            return lines

        log = "".join(_beside(run, arriving))
    done = re.search(r"warm-up done in ([0-9.]+)s", log)
    if done is None:
        raise RuntimeError(f"{' '.join(cmd)}: no 'warm-up done' line in its output:\n{log[-2000:]}")
    changes = re.findall(r"torch threads (\d+) -> (\d+)", log)
    return {"times": [float(done[1])], "threads": changes[-1][1] if changes else "-", "thread_changes": len(changes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", nargs="+", default=["0", "4", "4@19"],
                    help="busy-loop processes to run beside: N, or N@NICE for N processes at that niceness")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per measurement (after 2 untimed)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the settings, interleaved")
    ap.add_argument("--stage-steps", type=int, default=0, metavar="N",
                    help="time the whole `agentr1 train --stage warmup` (default config, N steps) instead of single steps")
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=DEFAULT_SETTINGS, metavar="NAME",
                    help=f"which settings to measure, of: {'; '.join(SETTINGS)} (default: {'; '.join(DEFAULT_SETTINGS)})")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before the run", flush=True)
    rows, names, threads = [], args.settings, {}
    unit = f"warm-up stage ({args.stage_steps} steps)" if args.stage_steps else "step"
    for load in args.loads:
        n_busy, niceness, after = parse_load(load)
        busy = start_busy(n_busy, niceness) if after is None else []
        time.sleep(1.0 if busy else 0.0)
        try:
            times: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.repeats):  # rounds interleave the settings: drift hits all alike
                for name in names:
                    arriving = None if after is None else (n_busy, niceness, after)
                    res = (measure_stage(SETTINGS[name], args.stage_steps, arriving) if args.stage_steps else
                           measure(SETTINGS[name], args.steps, arriving))
                    times[name] += res["times"]
                    changes = res.get("thread_changes", 0)
                    threads[name] = f"{res['threads']}" + (f" ({changes} change{'s' * (changes > 1)})" if changes else "")
            for name in names:
                med = statistics.median(times[name])
                rows.append((load, name, threads[name], med))
                print(f"load {load}: {name}: {threads[name]} torch threads, median {unit} {med:.3f} s", flush=True)
        finally:
            stop_busy(busy)
    idle = {name: med for load, name, _, med in rows if parse_load(load)[0] == 0}
    spin = idle.get("2 threads, OpenMP's default wait")  # the idle cost of a policy is against this one
    print(f"\n| busy processes (@nice) | setting | torch threads at the end | median {unit} (s) | x idle, same setting "
          "| x idle, OpenMP's default wait |")
    print("|---:|---|---:|---:|---:|---:|")
    for load, name, threads, med in rows:
        ratio = f"{med / idle[name]:.2f}" if name in idle else "-"
        vs_spin = f"{med / spin:.2f}" if spin else "-"
        print(f"| {load} | {name} | {threads} | {med:.3f} | {ratio} | {vs_spin} |")


if __name__ == "__main__":
    main()
