"""How OpenMP threads wait (agentr1/device.py): passive unless told otherwise (``auto`` chooses
from what the machine is doing at start), never over the user's own setting, inherited by child
processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentr1 import device as threads


@pytest.mark.parametrize("busy", [0.0, 1.7])
def test_the_default_is_passive_whatever_the_load_at_start(busy):
    # Load that arrives after OpenMP started cannot change its policy: a quiet start is no promise.
    env: dict[str, str] = {}
    assert threads.configure_threads(env, busy=busy) == "passive"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env[threads.CHOICE_ENV] == "passive"


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
