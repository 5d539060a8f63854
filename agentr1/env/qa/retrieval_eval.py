"""How much of the supporting evidence BM25 finds when the question itself is the query.

A one-shot retrieval baseline: multi-hop questions should score well on ``any`` (the first
hop's entity is named in the question) and poorly on ``all`` (later hops' entities are not),
which is the gap an agent that searches several times has to close.
"""
from __future__ import annotations

import os
from pathlib import Path

from agentr1.data.records import QARecord, load_corpus_dir, load_split
from agentr1.env.qa.search import Hit, SearchIndex


def support_recall(records: list[QARecord], hits: list[list[Hit]], k: int) -> dict:
    """Recall of supporting docs among each record's hits; records without support are skipped."""
    scored = [(set(r.supporting_docs), {h.doc_id for h in hs[:k]}) for r, hs in zip(records, hits) if r.supporting_docs]
    n = len(scored)
    if n == 0:
        return {"n": 0, "any_support_at_k": 0.0, "all_support_at_k": 0.0, "mean_support_recall_at_k": 0.0}
    return {
        "n": n,
        "any_support_at_k": sum(bool(gold & found) for gold, found in scored) / n,
        "all_support_at_k": sum(gold <= found for gold, found in scored) / n,
        "mean_support_recall_at_k": sum(len(gold & found) / len(gold) for gold, found in scored) / n,
    }


def retrieval_eval(
    data_dir: str | os.PathLike, split: str, k: int = 5, cache_dir: str | Path | None = None
) -> dict:
    """{"split", "k", "n", "any_support_at_k", "all_support_at_k", "mean_support_recall_at_k"}."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    records = load_split(data_dir, split)
    index = SearchIndex.build(load_corpus_dir(data_dir), cache_dir)
    hits = index.batch_search([r.question for r in records], k)
    return {"split": split, "k": k, **support_recall(records, hits, k)}
