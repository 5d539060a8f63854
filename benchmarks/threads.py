"""The default warm-up's training step on an idle and on a loaded machine, per threading setting.

Why: torch's CPU build runs its intra-op thread pool on OpenMP (libgomp), whose threads spin at
every barrier. When other programs keep the cores busy, a spinning thread holds a core its
partner needs, and a 2-thread step slowed ~10x on a machine at load ~7 (issue 30). The setting
chosen here is applied by ``agentr1/threads.py`` where every process starts.

Each measurement runs in a fresh process (OpenMP reads its environment when torch loads it),
side by side in one run: for each load (``--loads``: 0 and 4 busy-loop processes that this script
starts and stops itself) and each setting, the median of ``--steps`` warm-up demonstration steps
(forward, loss on action tokens, backward, clip, Muon step) of the default run's model
(``conf/train.yaml``) on 32 episodes shaped like the default run's. Usage::

    python benchmarks/threads.py [--loads 0 4] [--steps 12]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, random, sys, time
t_import = time.perf_counter()
import torch
from agentr1.config import load_config
from agentr1.rl.optim import MuonWithAdamW, muon_groups
from agentr1.rl.sft import sft_loss
from benchmarks.update_efficiency import synthetic_episode
from models.policy import ActorCritic, ModelSpec
from transformers import Qwen2Config, Qwen2ForCausalLM

cfg = load_config("conf/train.yaml")
spec = ModelSpec.from_config(cfg.model)
config = Qwen2Config(vocab_size=cfg.model.vocab_size, hidden_size=spec.hidden_size,
                     intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
                     num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                     tie_word_embeddings=True, initializer_range=spec.init_std)
torch.manual_seed(0)
model = ActorCritic(Qwen2ForCausalLM(config)).train()
opt = MuonWithAdamW(muon_groups(model, cfg.sft.muon_lr, cfg.sft.lr, 0.0))
rng = random.Random(0)
demos = [synthetic_episode(rng, cfg.model.vocab_size, i) for i in range(cfg.sft.batch_size)]
ids = torch.tensor([t.token_ids for t in demos])
target = torch.tensor([t.action_mask[1:] for t in demos], dtype=torch.float)
times = []
for step in range(int(sys.argv[1]) + 2):
    t0 = time.perf_counter()
    loss, _ = sft_loss(model, ids, torch.ones_like(ids), target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
print(json.dumps({"threads": torch.get_num_threads(), "times": times[2:]}))
"""

# name -> environment changes (None removes the variable). "agentr1 default" is what every agentr1
# process gets from agentr1/threads.py (so its row is measured through that module).
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
    "agentr1 default (agentr1/threads.py)": _setting(None, agentr1=None),
}


DEFAULT_SETTINGS = ["2 threads, OpenMP's default wait", "2 threads, OMP_WAIT_POLICY=PASSIVE", "1 thread",
                    "agentr1 default (agentr1/threads.py)"]


def _busy(niceness: int) -> None:
    os.nice(niceness)
    while True:
        pass


def parse_load(text: str) -> tuple[int, int]:
    """``"4"`` -> 4 busy processes at this process's priority; ``"4@19"`` -> 4 at nice 19."""
    n, _, nice = text.partition("@")
    return int(n), int(nice or 0)


def measure(env_changes: dict[str, str | None], steps: int) -> dict:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    # `import agentr1` first, as every entry point does: that is where agentr1/threads.py runs.
    code = "import agentr1\n" + CHILD
    out = subprocess.run([sys.executable, "-c", code, str(steps)], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


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
