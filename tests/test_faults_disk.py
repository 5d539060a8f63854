"""A full disk: one line naming the path and the bytes, exit status 4, nothing half-written.

Each case runs in a child process whose output directory is a small tmpfs mounted in its own user
and mount namespace (``unshare -rm``: no privileges needed, nothing mounted on the host). Where
the kernel allows no user namespace the cases are skipped (they say why).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentr1.errors import EXIT_NO_SPACE

ROOT = Path(__file__).resolve().parents[1]


def _userns_ok() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot mount a tmpfs in a user namespace: {probe.stderr.strip()}"


SKIP = _userns_ok()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def in_small_tmpfs(mount: Path, size: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """``argv`` run with a ``size`` tmpfs mounted at ``mount`` (in the child's namespace only)."""
    mount.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={size} tmpfs "{mount}" && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, **kw)


def test_a_write_that_fills_the_disk_leaves_nothing_and_says_so(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from agentr1.fsutil import atomic_dir, NoSpaceError
        out = Path({str(tmp_path / "mnt")!r})
        try:
            atomic_dir(out / "big", lambda d: (d / "blob").write_bytes(os.urandom(2 << 20)))
        except NoSpaceError as e:
            print(e)
        print(sorted(p.name for p in out.iterdir()))
    """)
    proc = in_small_tmpfs(tmp_path / "mnt", "512k", [sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    message, listing = proc.stdout.strip().splitlines()
    assert message.startswith(f"{tmp_path / 'mnt' / 'big'}: no space left on the device") and "free" in message
    assert listing == "[]"  # no half-written directory under the final name, no temporary left


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "pipeline"])
def test_train_and_pipeline_say_the_disk_is_full_in_one_line(command, tmp_path):
    from test_trainer import TINY

    from agentr1.config import load_config
    from agentr1.recipe.workspace import Workspace

    data = tmp_path / "data"
    Workspace.build(load_config("conf/train.yaml", [f"data.dir={data}", *TINY]))
    out = tmp_path / "mnt"
    overrides = [f"data.dir={data}", *TINY, "rollout.backend=hf", "ppo.iterations=1"]
    args = [x for o in overrides for x in ("-o", o)]
    argv = ([sys.executable, "-m", "cli", "train", "-o", f"output_dir={out / 'run'}", *args]
            if command == "train" else
            [sys.executable, "-m", "cli", "pipeline", "--output-dir", str(out / "run"), *args])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PREFECT_HOME": str(tmp_path / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PREFECT_API_URL": ""}
    env.pop("PREFECT_API_URL")
    proc = in_small_tmpfs(out, "96k", argv, env=env)
    assert proc.returncode == EXIT_NO_SPACE, proc.stderr[-3000:]
    # The last line of ours (Prefect's temporary server may say it stops after it).
    said = [line for line in proc.stderr.splitlines() if line.startswith("agentr1: error: ")]
    assert len(said) == 1 and "free" in said[0] and str(out / "run") in said[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not json.dumps(proc.stdout).strip('"')  # nothing on stdout
