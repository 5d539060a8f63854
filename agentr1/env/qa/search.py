"""The search tool: BM25 over a corpus (bm25s, English stopwords, Porter2 stemming via PyStemmer).

Each document is indexed as ``title + text``. The index is cached on disk under
``cache_dir/<sha256 of the canonical corpus.jsonl>[:16]``, so a second build of the same
corpus loads it instead of re-indexing.

Retrieval is exact and deterministic: all queries of a batch are scored in one sparse
matrix product against bm25s's precomputed per-term document scores (the same numbers
``BM25.get_scores`` gives), then ranked by score with ties broken by corpus order (bm25s's
own top-k uses an unstable partition, so equal scores could come back in either order).
Documents that share no term with the query are never returned: an empty or stopword-only
query gives ``[]``.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import bm25s
import numpy as np
import scipy.sparse as sp
import Stemmer

from agentr1.data.records import Document, corpus_digest, load_corpus_dir
from agentr1.fsutil import as_created

CACHE_ENV = "AGENTR1_CACHE"
DEFAULT_CACHE = Path("~/.cache/agentr1")
CACHE_KEY_CHARS = 16
LANGUAGE = "english"
STOPWORDS = "en"
# bm25s defaults (Lucene variant); recorded in the cache so another setting never loads it.
BM25_PARAMS = {"method": "lucene", "k1": 1.5, "b": 0.75}
_SPEC_FILE = "agentr1_spec.json"
_SPEC = {"format": 1, "language": LANGUAGE, "stopwords": STOPWORDS, "fields": "title+text", **BM25_PARAMS}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    doc_id: str
    title: str
    text: str
    score: float
    rank: int  # 1-based


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def _tokenize(texts: Sequence[str], stemmer: Stemmer.Stemmer) -> list[list[str]]:
    """Lower-cased, stopword-free, stemmed terms of each text (bm25s's tokenizer)."""
    if not texts:
        return []
    return bm25s.tokenize(list(texts), stopwords=STOPWORDS, stemmer=stemmer, return_ids=False, show_progress=False)


def _doc_text(doc: Document) -> str:
    return f"{doc.title}\n{doc.text}"


class SearchIndex:
    """BM25 index over a fixed list of documents."""

    def __init__(self, docs: list[Document], retriever: bm25s.BM25):
        self.docs = list(docs)
        self.retriever = retriever
        self._stemmer = Stemmer.Stemmer(LANGUAGE)
        scores = retriever.scores
        # (num_docs, vocab): column t holds every doc's BM25 weight for term t.
        self._matrix = sp.csc_matrix(
            (scores["data"], scores["indices"], scores["indptr"]),
            shape=(scores["num_docs"], len(scores["indptr"]) - 1),
        ).tocsr()
        self._vocab: dict[str, int] = retriever.vocab_dict
        if scores["num_docs"] != len(self.docs):
            raise ValueError(f"index has {scores['num_docs']} documents, corpus has {len(self.docs)}")

    # ------------------------------------------------------------ building

    @classmethod
    def build(cls, docs: list[Document], cache_dir: str | Path | None = None) -> "SearchIndex":
        """Index ``docs``, or load the cached index of the same corpus content."""
        if not docs:
            raise ValueError("cannot build a search index over an empty corpus")
        path = cls.cache_path(docs, cache_dir)
        retriever = _load_cached(path)
        if retriever is None:
            retriever = _index(docs)
            _save_cached(retriever, path)
        return cls(docs, retriever)

    @classmethod
    def from_data_dir(cls, data_dir: str | Path, cache_dir: str | Path | None = None) -> "SearchIndex":
        """Index DATA_DIR/corpus.jsonl."""
        return cls.build(load_corpus_dir(data_dir), cache_dir)

    @staticmethod
    def cache_path(docs: Sequence[Document], cache_dir: str | Path | None = None) -> Path:
        """Where the index of ``docs`` is (or would be) cached."""
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return root / corpus_digest(docs)[:CACHE_KEY_CHARS]

    # ------------------------------------------------------------ searching

    def search(self, query: str, k: int) -> list[Hit]:
        """Top-``k`` documents for one query (fewer when fewer documents match)."""
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` documents for each query, scored together in one sparse product."""
        if not queries:
            return []
        scores = self._score_matrix(queries)
        return [self._top_k(*self._row(scores, i), k) for i in range(len(queries))]

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """Dense BM25 scores (Q, N) of every document for each query (for small checks)."""
        return self._score_matrix(queries).toarray()

    def _score_matrix(self, queries: Sequence[str]) -> sp.csr_matrix:
        """Sparse (Q, N) scores: only documents sharing a term with the query are stored."""
        rows, cols = [], []
        for i, terms in enumerate(_tokenize(queries, self._stemmer)):
            ids = [self._vocab[t] for t in terms if t and t in self._vocab]
            rows.extend([i] * len(ids))
            cols.extend(ids)
        # A repeated query term counts once per occurrence, as in bm25s.get_scores.
        counts = sp.csr_matrix(
            (np.ones(len(rows), dtype=np.float32), (rows, cols)),
            shape=(len(queries), self._matrix.shape[1]),
        )
        return (counts @ self._matrix.T).tocsr()

    @staticmethod
    def _row(matrix: sp.csr_matrix, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc indices, scores) stored in row i."""
        start, end = matrix.indptr[i], matrix.indptr[i + 1]
        return matrix.indices[start:end], matrix.data[start:end]

    def _top_k(self, doc_idx: np.ndarray, scores: np.ndarray, k: int) -> list[Hit]:
        keep = scores > 0
        doc_idx, scores = doc_idx[keep], scores[keep]
        if k <= 0 or doc_idx.size == 0:
            return []
        if doc_idx.size > k:
            # Keep every doc tying with the k-th score, then rank exactly.
            kth = np.partition(scores, doc_idx.size - k)[doc_idx.size - k]
            doc_idx, scores = doc_idx[scores >= kth], scores[scores >= kth]
        order = np.lexsort((doc_idx, -scores))[:k]  # score desc, then corpus order
        hits = []
        for rank, j in enumerate(order, start=1):
            doc = self.docs[int(doc_idx[j])]
            hits.append(Hit(doc.id, doc.title, doc.text, float(scores[j]), rank))
        return hits


def _index(docs: Sequence[Document]) -> bm25s.BM25:
    """A bm25s index with a vocabulary numbered by first occurrence (deterministic files)."""
    corpus_terms = _tokenize([_doc_text(d) for d in docs], Stemmer.Stemmer(LANGUAGE))
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in terms] for terms in corpus_terms]
    retriever = bm25s.BM25(**BM25_PARAMS)
    retriever.index((ids, vocab), show_progress=False)
    return retriever


def _load_cached(path: Path) -> bm25s.BM25 | None:
    spec_file = path / _SPEC_FILE
    try:
        if json.loads(spec_file.read_text()) != _SPEC:
            return None
        return bm25s.BM25.load(str(path), show_progress=False, verbosity=0)
    except (OSError, ValueError) as e:
        if path.exists():
            log.warning("ignoring unreadable search index cache %s: %s", path, e)
        return None


def _save_cached(retriever: bm25s.BM25, path: Path) -> None:
    """Write into a temp sibling, then rename: a concurrent reader never sees half an index."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        as_created(tmp, directory=True)
    except OSError as e:
        log.warning("search index not cached (%s): %s", path, e)
        return
    try:
        retriever.save(str(tmp), show_progress=False)
        (tmp / _SPEC_FILE).write_text(json.dumps(_SPEC, sort_keys=True))
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        os.rename(tmp, path)
    except OSError as e:
        # Another process may have won the race; either way the in-memory index is fine.
        log.warning("search index not cached (%s): %s", path, e)
        shutil.rmtree(tmp, ignore_errors=True)


def format_hits(hits: Sequence[Hit], max_chars_per_doc: int | None = None, header: bool = True) -> str:
    """"Doc 1 (Title): text" lines, one per hit: the body placed inside <tool_response>.

    ``header=False`` leaves out "Doc 1 (Title): " and gives the texts alone.
    """
    return "\n".join((f"Doc {hit.rank} ({hit.title}): " if header else "") + _truncate(hit.text, max_chars_per_doc)
                     for hit in hits)


def _truncate(text: str, max_chars: int | None) -> str:
    """At most ``max_chars`` characters, cut at a word boundary so no name is half-shown."""
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    if text[max_chars] != " " and " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip()


NO_RESULTS = "No documents found."


class SearchTool:
    """The ``search`` tool the agent calls: top-``k`` BM25 documents of ``index`` as text, and
    their ids as the output's keys (matched against a record's ``supporting_docs``). All of a
    turn's searches go in one ``batch_search``."""

    name = "search"

    def __init__(self, index: SearchIndex, k: int, max_doc_chars: int | None, header: bool):
        self.index, self.k, self.max_doc_chars, self.header = index, k, max_doc_chars, header

    def __call__(self, query: str):
        """Search the document collection and return the best matching documents.

        Args:
            query: The search query, e.g. an entity name.
        """
        return self.batch([{"query": query}])[0]

    def batch(self, calls: list[dict]) -> list:
        from agentr1.env.tools import ToolOutput

        hits = self.index.batch_search([c["query"] for c in calls], self.k)
        return [ToolOutput(format_hits(h, self.max_doc_chars, header=self.header) or NO_RESULTS,
                           tuple(hit.doc_id for hit in h)) for h in hits]


def index_of(path: Path) -> SearchIndex:
    """The index of a dataset directory's corpus, or of a corpus file (a served agent's)."""
    from agentr1.data.records import load_corpus

    return SearchIndex.build(load_corpus(path)) if path.is_file() else SearchIndex.from_data_dir(path)


def search_tool(cfg, data_dir: Path) -> SearchTool:
    """The registered ``search`` tool's factory: BM25 over ``data_dir``'s corpus (or a corpus file)."""
    return SearchTool(index_of(data_dir), cfg.env.top_k, cfg.env.max_doc_chars, cfg.env.doc_header)
