"""How OpenMP threads wait (agentr1/device.py): passive unless told otherwise (``auto`` chooses
from what the machine is doing at start), never over the user's own setting, inherited by child
processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentr1 import device as threads


@pytest.mark.parametrize("busy", [0.0, 1.7])
def test_the_default_is_passive_whatever_the_load_at_start(busy):
    # Load that arrives after OpenMP started cannot change its policy: a quiet start is no promise.
    env: dict[str, str] = {}
    assert threads.configure_threads(env, busy=busy) == "passive"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env[threads.CHOICE_ENV] == "passive"


def test_adapt_spins_and_leaves_load_to_the_governor_unless_the_count_is_fixed():
    env = {threads.CHOICE_ENV: "adapt"}
    assert threads.configure_threads(env) == "adapt"
    assert "OMP_WAIT_POLICY" not in env and env[threads.CHOICE_ENV] == "adapt"  # children adapt too
    # A fixed count: nothing would take a spinning thread away under load, so it waits passively.
    env = {threads.CHOICE_ENV: "adapt", "OMP_NUM_THREADS": "2"}
    assert threads.configure_threads(env) == "passive" and env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_auto_on_a_busy_machine_gets_the_passive_wait_policy_and_children_inherit_it():
    env = {threads.CHOICE_ENV: "auto"}
    assert threads.configure_threads(env, busy=1.7) == "passive"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env[threads.CHOICE_ENV] == "passive"
    # A child process started with this environment keeps the parent's choice, whatever it measures.
    assert threads.configure_threads(env, busy=0.0) == "user"


def test_auto_on_an_idle_machine_keeps_openmp_s_default_and_says_so_to_children():
    env = {threads.CHOICE_ENV: "auto"}
    assert threads.configure_threads(env, busy=0.1) == "default"
    assert "OMP_WAIT_POLICY" not in env and env[threads.CHOICE_ENV] == "default"
    assert threads.configure_threads(env, busy=3.0) == "default"  # a child beside its busy parent


@pytest.mark.parametrize("given", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "1000"},
                                   {threads.CHOICE_ENV: "off"}])
def test_the_user_s_setting_wins(given):
    env = dict(given)
    assert threads.configure_threads(env, busy=2.0) in ("user", "off")
    assert env == given


def test_a_forced_choice_and_a_bad_one():
    env = {threads.CHOICE_ENV: "passive"}
    assert threads.configure_threads(env, busy=0.0) == "passive" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    with pytest.raises(ValueError, match="AGENTR1_OMP_WAIT"):
        threads.configure_threads({threads.CHOICE_ENV: "fast"})


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")
def test_the_measurement_sees_a_busy_core():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert threads.busy_cores(0.5) > 0.5
    finally:
        busy.kill()
        busy.wait()


def test_importing_agentr1_sets_the_policy_before_torch_loads():
    code = ("import os, sys; import agentr1; assert 'torch' not in sys.modules; "
            "print(os.environ['AGENTR1_OMP_WAIT'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.CHOICE_ENV)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "passive"


@pytest.mark.parametrize("given, expected", [(None, "cpu"), ("cuda", "cuda")])
def test_importing_agentr1_keeps_jax_off_the_gpu_unless_the_user_says(given, expected):
    # bm25s runs JAX at import where JAX is installed; on a GPU JAX would take 75% of its memory.
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if given:
        env["JAX_PLATFORMS"] = given
    code = "import os, agentr1; print(os.environ['JAX_PLATFORMS'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected


class _Clock:
    """A fake /proc: ``advance(seconds, others)`` moves time on with other programs keeping
    ``others`` cores busy and this process (and its children) one core."""

    def __init__(self):
        self.t, self.machine, self.family = 0.0, 0, 0
        self.ticks = os.sysconf("SC_CLK_TCK")

    def advance(self, seconds: float, others: float) -> None:
        self.t += seconds
        self.family += round(seconds * self.ticks)
        self.machine += round(seconds * self.ticks * (1 + others))

    def __call__(self):
        return self.t, self.machine, self.family


@pytest.fixture
def two_threads(monkeypatch):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_start_threads", None)  # as in a fresh process
    yield
    torch.set_num_threads(before)


def _governor(clock: _Clock, window_s: float = 2.0, cores: int = 2) -> "threads.ThreadGovernor":
    gov = threads.ThreadGovernor(window_s=window_s, sample=clock, enabled=True)
    gov.cores = cores
    return gov


def test_the_governor_yields_a_thread_while_others_keep_the_cores_busy_and_takes_it_back(two_threads, caplog):
    clock = _Clock()
    gov = _governor(clock)
    clock.advance(1.0, others=1.6)
    assert gov.step() == 2  # the window is not over: no decision on a second's evidence
    clock.advance(1.5, others=1.6)
    with caplog.at_level("INFO", logger="agentr1.train"):
        assert gov.step() == 1 and gov.threads == 1 and gov.changes == 1
    assert "torch threads 2 -> 1" in caplog.text and "1.6 of 2 cores" in caplog.text
    clock.advance(3.0, others=1.6)  # still loaded: stays at one thread
    assert gov.step() == 1 and gov.changes == 1
    clock.advance(3.0, others=0.6)  # one other core's worth: 2 - 0.6 rounds to 1
    assert gov.step() == 1
    clock.advance(3.0, others=0.05)  # the load went away
    assert gov.step() == 2 and gov.changes == 2
    clock.advance(3.0, others=0.0)
    assert gov.step() == 2 and gov.changes == 2


def test_a_later_governor_gives_back_what_an_earlier_one_took(two_threads):
    # The warm-up's governor may end at one thread; PPO's, in the same process, may go back to two.
    clock = _Clock()
    warmup = _governor(clock, window_s=1.0)
    clock.advance(2.0, others=1.8)
    assert warmup.step() == 1
    ppo = _governor(clock, window_s=1.0)
    assert ppo.max_threads == 2
    clock.advance(2.0, others=0.0)
    assert ppo.step() == 2


def test_the_governor_never_goes_past_the_count_of_the_process_at_start(two_threads):
    import torch

    torch.set_num_threads(1)
    clock = _Clock()
    gov = _governor(clock, window_s=1.0, cores=4)
    clock.advance(2.0, others=0.0)
    assert not gov.enabled and gov.step() == 1  # one thread at start: nothing to give back


@pytest.mark.parametrize("wait", ["passive", "default", None])
def test_the_governor_is_off_unless_the_wait_policy_is_adapt(two_threads, wait, monkeypatch):
    monkeypatch.setattr(threads, "_pinned", False)
    if wait is None:
        monkeypatch.delenv(threads.CHOICE_ENV, raising=False)
    else:
        monkeypatch.setenv(threads.CHOICE_ENV, wait)
    clock = _Clock()
    gov = threads.ThreadGovernor(window_s=1.0, sample=clock)
    clock.advance(2.0, others=2.0)
    assert not gov.enabled and gov.step() == 2


def test_a_pinned_count_is_left_alone(two_threads, monkeypatch):
    monkeypatch.setenv(threads.CHOICE_ENV, "adapt")
    monkeypatch.setattr(threads, "_pinned", False)
    assert threads.ThreadGovernor(sample=_Clock()).enabled
    monkeypatch.setattr(threads, "_pinned", True)  # OMP_NUM_THREADS at start
    assert not threads.ThreadGovernor(sample=_Clock()).enabled
    monkeypatch.setattr(threads, "_pinned", False)
    threads.pin_threads(2)  # the ablation's runs
    assert not threads.ThreadGovernor(sample=_Clock()).enabled


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")
def test_a_busy_child_counts_as_this_run_s_own_work():
    # The run's own Prefect server is no reason to yield: its CPU time is the family's, while it
    # runs (a live descendant) and after (a reaped child's time is its parent's cutime).
    ticks = os.sysconf("SC_CLK_TCK")
    before = threads._family_busy()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(1.5)
        assert threads._family_busy() - before >= 0.3 * ticks  # alive
    finally:
        child.wait(timeout=30)
    assert threads._family_busy() - before >= 0.6 * ticks  # reaped
