"""Making a dataset through the registry: an environment kind's converters (real benchmarks'
files) or its generator.

:func:`convert_sources` runs ``data.sources`` (each input through its format's converter, its
records into its split, a share of them into ``dev`` by a hash of the record id) and
:func:`write_converted` writes the result with the kind it is for recorded in the dataset's
marker, which ``agentr1 data validate`` reads and a run checks against its ``env.kind``.
``agentr1 data convert`` converts one input (:func:`convert_to_dataset`), into one split or into
train/dev/test by the id hash (``agentr1.data.splits``). Each kind's converters live in its
package (``agentr1.env.qa.convert``, ``agentr1.env.math_tool.convert``, ...).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from agentr1.config import DataSource
from agentr1.data.splits import DEFAULT_SPLIT, check_fractions, split_of
from agentr1.data.generated import write_dataset
from agentr1.data.records import DataError, Document, QARecord
from agentr1.env.registry import converter


@dataclass
class Converted:
    """What :func:`convert_sources` made: the kind, the records by split, the corpus, a summary."""

    kind: str
    splits: dict[str, list[QARecord]]
    corpus: list[Document]
    summary: dict


def convert_sources(sources: list[DataSource], fractions: tuple[float, float] | None = None) -> Converted:
    """Every source converted, its records in ``source.split`` (``source.dev_fraction`` of them in
    dev); with ``fractions=(dev, test)`` every record in train/dev/test by the id hash instead. All
    sources must be formats of one environment kind; record ids must be unique, and a corpus
    document given twice must be the same."""
    if not sources:
        raise ValueError("no data sources")
    if fractions is not None:
        check_fractions(*fractions)
    kinds = {converter(s.format)[0] for s in sources}
    if len(kinds) > 1:
        raise DataError("data.sources", None, "format", f"formats of different environment kinds ({sorted(kinds)}): "
                        "a dataset is for one kind")
    splits: dict[str, list[QARecord]] = {}
    corpus: dict[str, Document] = {}
    seen: dict[str, str] = {}
    per_source = []
    for k, source in enumerate(sources):
        # Split by the hash, most records land in train: the converter treats the input as training data
        as_read = source.model_copy(update={"split": "train"}) if fractions else source
        records, docs, skipped = converter(source.format)[1](as_read)
        counts: dict[str, int] = {}
        for r in records:
            if r.id in seen:
                raise DataError(source.input or source.format, None, "id",
                                f"record id {r.id!r} of data.sources[{k}] is also in {seen[r.id]}")
            seen[r.id] = f"data.sources[{k}]"
            key = r.meta.get("origin", r.id)  # a variant of a question goes where the question goes
            split = split_of(key, *fractions) if fractions else (
                "dev" if source.dev_fraction and split_of(key, source.dev_fraction, 0.0) == "dev" else source.split)
            splits.setdefault(split, []).append(r)
            counts[split] = counts.get(split, 0) + 1
        for d in docs:
            if corpus.setdefault(d.id, d) != d:
                raise DataError(source.input or source.format, None, "corpus",
                                f"document id {d.id!r} of data.sources[{k}] names another document already")
        per_source.append({"format": source.format, **({"input": source.input} if source.input else {}),
                           **({"categories": source.categories} if source.categories else {}),
                           "splits": counts, **({"left_out": skipped} if skipped else {})})
    kind = kinds.pop()
    summary = {"kind": kind, "splits": {s: len(rs) for s, rs in splits.items()}, "n_docs": len(corpus),
               "sources": per_source}
    return Converted(kind, splits, list(corpus.values()), summary)


def write_converted(converted: Converted, out_dir: str | os.PathLike) -> dict:
    """Write ``converted`` as a dataset (``write_dataset``: only where agentr1 may), the kind in its
    marker; returns the summary."""
    write_dataset(out_dir, converted.splits, converted.corpus, kind=converted.kind)
    return converted.summary


def convert_to_dataset(source: DataSource, out_dir: str | os.PathLike,
                       fractions: tuple[float, float] | None = None) -> dict:
    """``agentr1 data convert``: one input into ``out_dir``, every record in ``source.split``
    (default ``dev``: a converted file is an evaluation set unless told otherwise) or, with
    ``fractions=(dev, test)``, in train/dev/test by the id hash."""
    return write_converted(convert_sources([source], fractions), out_dir)


__all__ = ["DEFAULT_SPLIT", "Converted", "convert_sources", "convert_to_dataset", "write_converted"]
