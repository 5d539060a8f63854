"""Datasets agentr1 writes: the generator's marker, what it may replace, and the writer.

Generated data never replaces what a user made: :func:`write_dataset` writes only into a
directory that does not exist or that carries the generator's marker (``records.MARKER_FILE``,
holding nothing but the files the marker lists and none of them edited since); it writes into a
temporary sibling and renames it at the end, so a failure never leaves a partial dataset
behind, and what it wrote passes ``records.check_dataset`` first. The marker is listed in
``.dvcignore``, so it does not change the hash DVC records for the data.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from agentr1.data.records import (CORPUS_FILE, MARKER_FILE, QA_DIR, DataError, Document, QARecord, available_splits,
                                  check_dataset, corpus_path, raise_errors, split_path, to_jsonl)
from agentr1.fsutil import atomic_dir, file_sha256

MARKER_GENERATOR = "agentr1"
# Split names become file names; keep them to a safe alphabet.
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _marked_files(data_dir: Path) -> list[str] | None:
    """The files the generator wrote into ``data_dir`` (from its marker), None when unmarked."""
    try:
        marker = json.loads((data_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("generator") != MARKER_GENERATOR:
        return None
    files = marker.get("files")
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else None


def dataset_kind(data_dir: str | os.PathLike) -> str | None:
    """The environment kind a dataset was converted for (recorded in its marker by
    ``write_dataset(kind=...)``), None when it records none (generated data, a user's own)."""
    try:
        marker = json.loads((Path(data_dir) / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = marker.get("kind") if isinstance(marker, dict) else None
    return kind if isinstance(kind, str) else None


def changed_since_generated(data_dir: str | os.PathLike) -> list[str]:
    """The files of a generated dataset that are there but no longer hold what the generator
    wrote (a user's edits); every file that is there when the marker recorded no digests."""
    data_dir = Path(data_dir)
    try:
        digests = json.loads((data_dir / MARKER_FILE).read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError, AttributeError):
        digests = None
    present = [f for f in (_marked_files(data_dir) or []) if (data_dir / f).is_file()]
    if not isinstance(digests, dict):
        return present
    return [f for f in present if digests.get(f) != file_sha256(data_dir / f)]


def _entries_under(data_dir: Path, keep_dirs: set[str] = frozenset()) -> list[str]:
    """Every entry under ``data_dir`` (files, links of any kind, directories, not following links),
    but the directories in ``keep_dirs``, relative POSIX paths: what replacing it would delete."""
    out = []
    for root, dirs, files in os.walk(data_dir, followlinks=False):
        for name in [*dirs, *files]:
            rel = (Path(root) / name).relative_to(data_dir).as_posix()
            if rel not in keep_dirs or (Path(root) / name).is_symlink():
                out.append(rel)
    return sorted(out)


def missing_parts(data_dir: str | os.PathLike) -> list[str]:
    """What a dataset directory lacks to be complete: the files its marker lists, or (unmarked)
    ``corpus.jsonl`` and at least one ``qa/*.jsonl``."""
    data_dir = Path(data_dir)
    marked = _marked_files(data_dir)
    if marked is not None:
        return [f for f in marked if not (data_dir / f).is_file()]
    missing = [] if corpus_path(data_dir).is_file() else [CORPUS_FILE]
    return missing + ([] if available_splits(data_dir) else [f"{QA_DIR}/<split>.jsonl"])


def generation_needed(data_dir: str | os.PathLike) -> bool:
    """Whether a generator may (re)make ``data_dir``: only when it does not exist, or is an
    incomplete dataset the generator made (marker). Anything else is left as it is for the
    loaders to judge, so an incomplete directory of a user's gets the same error, naming what is
    missing, from every entry point."""
    data_dir = Path(data_dir)
    if not data_dir.exists():
        return True
    return data_dir.is_dir() and _marked_files(data_dir) is not None and bool(missing_parts(data_dir))


def _check_replaceable(target: Path, overwrite: bool) -> None:
    """Only a directory that is absent, or that the generator made and holds nothing else, is written."""
    if not target.exists():
        return
    if not target.is_dir():
        raise DataError(target, None, None, "exists and is not a directory: not replaced")
    marked = _marked_files(target)
    if marked is None:
        raise DataError(target, None, None, f"exists and was not generated by agentr1 (no {MARKER_FILE}): not "
                        "replaced; remove it yourself or choose a directory that does not exist")
    if not overwrite:
        raise DataError(target, None, None, "exists: not replaced (overwrite=False)")
    # The folders of the files it wrote are its own; anything else (a user's file, folder or link,
    # even an empty folder or a link to one) would be deleted with the directory.
    folders = {Path(f).parents[i].as_posix() for f in marked for i in range(len(Path(f).parents) - 1)}
    foreign = [f for f in _entries_under(target, folders) if f != MARKER_FILE and f not in marked
               or (target / f).is_symlink()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise DataError(target, None, None, f"holds files agentr1 did not write ({shown}): not replaced")
    edited = changed_since_generated(target)
    if edited:  # a generated file a user has changed since is the user's
        raise DataError(target / edited[0], None, None,
                        "changed since agentr1 generated it (or generated by a version that kept no digests): the "
                        f"dataset is not regenerated over it; move {target} away to regenerate it"
                        + (f", or restore {', '.join(missing_parts(target))}" if missing_parts(target) else ""))


# ---------------------------------------------------------------- writing


def _moved(err: DataError, tmp: Path, target: Path) -> DataError:
    """``err`` about a file in the temporary dir, re-addressed to where the file was going."""
    path = Path(err.path)
    shown = target / path.relative_to(tmp) if path.is_relative_to(tmp) else path
    return DataError(shown, err.line, err.field, err.message)


def write_dataset(
    out_dir: str | os.PathLike,
    splits: dict[str, list[QARecord]],
    corpus: list[Document],
    overwrite: bool = True,
    files: dict[str, bytes] | None = None,
    kind: str | None = None,
) -> None:
    """Write DIR/qa/{split}.jsonl, DIR/corpus.jsonl, ``files`` ({name: bytes}, e.g. the SQL
    world's database) and the generator's marker (with ``kind``, the environment kind the data is
    for, when given: :func:`dataset_kind`) atomically, after the written files pass
    ``check_dataset`` (errors name the files under ``out_dir``).

    ``out_dir`` must not exist, or be a dataset this function wrote (marker) holding nothing
    else, which is then replaced (unless not ``overwrite``); anything else is a DataError and
    stays untouched. The files are written into a temporary sibling directory that is renamed
    to ``out_dir`` at the end, so an error leaves no partial output.
    """
    target = Path(out_dir)
    for split in splits:
        if not _SPLIT_NAME.match(split):
            raise DataError(split_path(target, split), None, None,
                            f"bad split name {split!r} (letters, digits, '_', '-', '.')")
    for name in files or {}:
        if not _SPLIT_NAME.match(name) or name in (CORPUS_FILE, MARKER_FILE):
            raise DataError(target / name, None, None, f"bad extra file name {name!r} (letters, digits, '_', '-', "
                            f"'.'; not {CORPUS_FILE} or {MARKER_FILE})")
    _check_replaceable(target, overwrite)

    def write(tmp: Path) -> None:
        (tmp / QA_DIR).mkdir()
        for split, records in splits.items():
            split_path(tmp, split).write_text(to_jsonl(r.to_json() for r in records), encoding="utf-8")
        corpus_path(tmp).write_text(to_jsonl(d.to_json() for d in corpus), encoding="utf-8")
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
        raise_errors([_moved(e, tmp, target) for e in check_dataset(tmp)])
        written = [CORPUS_FILE, *(f"{QA_DIR}/{split}.jsonl" for split in splits), *(files or {})]
        digests = {f: file_sha256(tmp / f) for f in written}
        marker = {"generator": MARKER_GENERATOR, "files": written, "sha256": digests, **({"kind": kind} if kind else {})}
        (tmp / MARKER_FILE).write_text(json.dumps(marker) + "\n")

    atomic_dir(target, write)
