"""Directories that appear whole or not at all.

Every artifact directory of the project (datasets, policies, checkpoints) is written into a
temporary sibling and then swapped into place, so a crash or a failed validation never
leaves a half-written directory under the final name.
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
