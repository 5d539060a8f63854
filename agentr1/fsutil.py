"""Files and directories that appear whole or not at all, and stay as they were written.

Every artifact of the project (datasets, policies, checkpoints, rollout tables, run records)
is written into a temporary sibling and then swapped into place, so a crash or a failed
validation never leaves a half-written file or directory under the final name.

Policies and checkpoints also carry a manifest (:data:`MANIFEST`: every file's size and
sha256, written last, inside the atomic write): :func:`verify_manifest` refuses a directory
whose files no longer match it (a file missing, truncated, rewritten, or flipped bits that keep
every value finite), naming the file, before anything is loaded from it.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from filelock import FileLock

from agentr1.errors import DamagedError, NoSpaceError  # noqa: F401 (DamagedError: raised here, imported from here)


TMP_INFIX = ".tmp-"
OLD_INFIX = ".old-"
LOCK_SUFFIX = ".lock"
LOCK_DIR = Path(tempfile.gettempdir()) / "agentr1-locks"  # writer_lock's files


def umask() -> int:
    """The process's umask, read where Linux shows it (``/proc/self/status``), else set and put back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_created(path: str | Path, directory: bool) -> None:
    """Give a ``tempfile`` directory (0700) or file (0600) the mode ``mkdir``/``open`` would have:
    what is swapped into place is then readable by whom the user's umask allows (a data set, a
    policy shared with a group or mounted into a container), as any file they create is."""
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


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


MANIFEST = "agentr1-manifest.json"
"""Every file of a directory (but itself) with its size and sha256: ``{"files": {path: {...}}}``."""
HASH_CHUNK = 1 << 20


def feed_file(digest, path: str | os.PathLike) -> None:
    """Update the hashlib object ``digest`` with the bytes of file ``path``, a chunk at a time."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
            digest.update(chunk)


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 hex digest of file ``path`` (read in chunks: model weights are GBs)."""
    h = hashlib.sha256()
    feed_file(h, path)
    return h.hexdigest()


def write_manifest(directory: str | Path) -> Path:
    """Record every file under ``directory`` (sizes and sha256) in its :data:`MANIFEST`."""
    directory = Path(directory)
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}
    path = directory / MANIFEST
    path.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    return path


def verify_manifest(directory: str | Path, fix: str, required: bool = True) -> bool:
    """Check ``directory`` against its manifest; :class:`DamagedError` (saying ``fix``) naming the
    first file that is missing, of another size or another hash, or the manifest itself when it
    is missing (``required``) or unreadable. Returns whether there was a manifest to check."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        if required:
            raise DamagedError(f"{path}: missing: {directory} was not written whole by agentr1, or was changed "
                               f"since; {fix}")
        return False
    try:
        files = json.loads(path.read_text())["files"]
        entries = [(name, int(e["size"]), str(e["sha256"])) for name, e in files.items()]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DamagedError(f"{path}: unreadable ({type(err).__name__}); {fix}") from None
    for name, size, digest in entries:
        file = directory / name
        if not file.is_file():
            raise DamagedError(f"{file}: missing (listed in {MANIFEST}); {fix}")
        if file.stat().st_size != size:
            raise DamagedError(f"{file}: {file.stat().st_size} bytes where {size} were written (truncated or "
                               f"rewritten); {fix}")
        if file_sha256(file) != digest:
            raise DamagedError(f"{file}: its sha256 differs from the one written (damaged since); {fix}")
    return True


SPACE_MARGIN = 1.1
"""Free space asked for beyond a write's estimate (filesystem blocks, metadata, a manifest)."""
LOW_SPACE_BYTES = 1 << 20
"""A write that fails with less than this free on its device failed for want of space: torch.save
says only "[enforce fail at inline_container.cc]" when the disk fills under it."""


def ensure_space(path: str | Path, need: int) -> None:
    """:class:`NoSpaceError` unless the device holding ``path`` (or its nearest existing parent)
    has ``need`` bytes free, with :data:`SPACE_MARGIN`."""
    where = Path(path)
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < need * SPACE_MARGIN:
        raise NoSpaceError(f"{path}: needs ~{_size(need)} and {where} has {_size(free)} free: free space on that "
                           "device, or choose another output_dir")


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def _out_of_space(err: BaseException, where: Path) -> bool:
    """Whether a write into ``where`` failed for want of space (ENOSPC/EDQUOT, or an error from a
    writer that hides it, with the device all but full); a NoSpaceError from a nested write is
    passed on as it is."""
    if isinstance(err, NoSpaceError):
        return False
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(err, (OSError, RuntimeError)):
        try:
            return shutil.disk_usage(where).free < LOW_SPACE_BYTES
        except OSError:
            return False
    return False


def atomic_dir(final: str | Path, write: Callable[[Path], None], manifest: bool = False,
               need: int | None = None) -> Path:
    """Run ``write(tmp_dir)`` in a temporary sibling of ``final``, then swap it into place; with
    ``manifest``, the directory's :data:`MANIFEST` is written last, before the swap. ``need``
    (bytes): checked free before anything is written. A write that runs out of space raises
    :class:`NoSpaceError` naming ``final`` (the temporary is removed: nothing half-written stays)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with writer_lock(final):  # another process's half-written temporary is not a leftover to clear
        recover_dir(final)
        if need is not None:
            ensure_space(final.parent, need)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{TMP_INFIX}", dir=final.parent))
        try:
            as_created(tmp, directory=True)
            write(tmp)
            if manifest:
                write_manifest(tmp)
            replace_dir(tmp, final)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if _out_of_space(err, final.parent):
                free = shutil.disk_usage(final.parent).free
                raise NoSpaceError(f"{final}: no space left on the device while writing it ({_size(free)} free"
                                   + (f", ~{_size(need)} needed" if need else "") + "): nothing was written; free "
                                   "space on that device, or choose another output_dir") from err
            raise
    return final


def writer_lock(final: str | Path) -> FileLock:
    """The lock every process on this machine holds while it writes ``final`` (re-entrant in a
    process): two runs making the same ``data.dir`` at once, a nightly retrain and a manual
    pipeline, take turns instead of clearing each other's half-written directory. The lock file
    is named by the path's digest in the temporary directory, not put beside ``final``: nothing
    is left in the user's directories, as a failed write must leave nothing."""
    key = hashlib.sha256(str(Path(final).resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    return FileLock(str(LOCK_DIR / f"{key}{LOCK_SUFFIX}"), is_singleton=True)


def recover_dir(final: str | Path) -> Path:
    """Undo what an interrupted :func:`atomic_dir` of ``final`` left behind (a kill -9 can stop
    it anywhere): without ``final``, the newest complete moved-aside version is put back; then
    every ``.<name>.tmp-*`` (half-written) and ``.<name>.old-*`` (superseded) sibling goes.

    Only names this module makes are touched. Call it holding :func:`writer_lock` when another
    process may be writing ``final`` (:func:`atomic_dir` does).
    """
    final = Path(final)
    if not final.parent.is_dir():
        return final
    olds = sorted(final.parent.glob(f".{glob.escape(final.name)}{OLD_INFIX}*"), key=lambda p: p.stat().st_mtime)
    if not final.exists():
        for old in reversed(olds):
            if (old / "data").is_dir():
                os.rename(old / "data", final)
                break
    for leftover in [*olds, *final.parent.glob(f".{glob.escape(final.name)}{TMP_INFIX}*")]:
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
        as_created(tmp, directory=False)
        write(Path(tmp))
        os.replace(tmp, final)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if _out_of_space(err, final.parent):
            raise NoSpaceError(f"{final}: no space left on the device while writing it "
                               f"({_size(shutil.disk_usage(final.parent).free)} free): nothing was written; free "
                               "space on that device, or choose another output_dir") from err
        raise
    return final


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) whole or not at all."""
    return atomic_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj) -> Path:
    """Write JSON (an object, or a list as JSON lines) whole or not at all."""
    return write_text(path, "".join(json.dumps(o) + "\n" for o in obj) if isinstance(obj, list)
                      else json.dumps(obj, indent=1, sort_keys=True))
