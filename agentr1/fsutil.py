"""Files and directories that appear whole or not at all.

Every artifact of the project (datasets, policies, checkpoints, rollout tables, run records)
is written into a temporary sibling and then swapped into place, so a crash or a failed
validation never leaves a half-written file or directory under the final name.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an old ``target`` is moved aside first and deleted last."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / "data")
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_dir(final: str | Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a temporary sibling of ``final``, then swap it into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        write(tmp)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def atomic_file(final: str | Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_path)`` on a temporary sibling file of ``final``, then rename it into
    place (``os.replace``); a failed write leaves neither ``final`` changed nor the temporary."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final
