"""Files and directories that appear whole or not at all.

Every artifact of the project (datasets, policies, checkpoints, rollout tables, run records)
is written into a temporary sibling and then swapped into place, so a crash or a failed
validation never leaves a half-written file or directory under the final name.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


TMP_INFIX = ".tmp-"
OLD_INFIX = ".old-"


def replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an old ``target`` is moved aside first and deleted last.

    A crash between the two renames leaves no ``target`` but a complete ``new`` and
    ``.<name>.old-*/data``: :func:`recover_dir` puts the old one back at the next start."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}{OLD_INFIX}", dir=target.parent))
        os.rename(target, old / "data")
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_dir(final: str | Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a temporary sibling of ``final``, then swap it into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{TMP_INFIX}", dir=final.parent))
    try:
        write(tmp)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def recover_dir(final: str | Path) -> Path:
    """Undo what an interrupted :func:`atomic_dir` of ``final`` left behind (a kill -9 can stop
    it anywhere): without ``final``, the newest complete moved-aside version is put back; then
    every ``.<name>.tmp-*`` (half-written) and ``.<name>.old-*`` (superseded) sibling goes.

    Only names this module makes are touched. Not for a directory two processes write at once.
    """
    final = Path(final)
    if not final.parent.is_dir():
        return final
    olds = sorted(final.parent.glob(f".{final.name}{OLD_INFIX}*"), key=lambda p: p.stat().st_mtime)
    if not final.exists():
        for old in reversed(olds):
            if (old / "data").is_dir():
                os.rename(old / "data", final)
                break
    for leftover in [*olds, *final.parent.glob(f".{final.name}{TMP_INFIX}*")]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    return final


def atomic_file(final: str | Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_path)`` on a temporary sibling file of ``final``, then rename it into
    place (``os.replace``); a failed write leaves neither ``final`` changed nor the temporary."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}{TMP_INFIX}", dir=final.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def write_json(path: str | Path, obj) -> Path:
    """Write JSON (an object, or a list as JSON lines) whole or not at all."""
    text = ("".join(json.dumps(o) + "\n" for o in obj) if isinstance(obj, list)
            else json.dumps(obj, indent=1, sort_keys=True))
    return atomic_file(path, lambda tmp: tmp.write_text(text))
