"""BM25 search: ranking, ties, empty queries, batching, the on-disk cache and formatting."""
from __future__ import annotations

import numpy as np
import pytest
import Stemmer

import agentr1.env.qa.search as search
from agentr1.data.generated import write_dataset
from agentr1.data.records import Document, QARecord
from agentr1.env.qa.search import Hit, SearchIndex, format_hits

DOCS = [
    Document("a", "Kelmora", "Kelmora is a city in Vostan. Kelmora has a busy harbour."),
    Document("b", "Vostan", "Vostan is a small country with a long coast."),
    Document("c", "Zorvak Pellin", "Zorvak Pellin was born in Kelmora. Zorvak Pellin directed Brim."),
    Document("twin1", "Twin", "Identical twin text about gardens."),
    Document("twin2", "Twin", "Identical twin text about gardens."),
    Document("e", "Running", "The runners were running races."),
]


@pytest.fixture()
def index(tmp_path):
    return SearchIndex.build(DOCS, cache_dir=tmp_path)


def test_ranks_the_matching_doc_first(index):
    assert [h.doc_id for h in index.search("Zorvak Pellin", 2)] == ["c"]  # no other doc has the terms
    hits = index.search("Kelmora Zorvak", 3)
    assert [h.doc_id for h in hits] == ["c", "a"]  # both terms beat one term twice
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert hits[0].title == "Zorvak Pellin" and hits[0].text == DOCS[2].text
    assert all(x.score >= y.score for x, y in zip(hits, hits[1:]))


def test_stemming_and_stopwords(index):
    assert index.search("run", 1)[0].doc_id == "e"  # 'running', 'runners' stem to 'run'
    assert index.search("the of is a", 3) == []  # stopwords only


def test_ties_break_by_corpus_order(index):
    hits = index.search("gardens", 5)
    assert [h.doc_id for h in hits] == ["twin1", "twin2"]
    assert hits[0].score == hits[1].score
    reordered = SearchIndex.build([DOCS[4], DOCS[3]], cache_dir=None)
    assert [h.doc_id for h in reordered.search("gardens", 1)] == ["twin2"]


def test_empty_and_unknown_queries_give_nothing(index):
    assert index.search("", 5) == []
    assert index.search("xylophone", 5) == []
    assert index.search("Kelmora", 0) == []
    assert index.batch_search([], 3) == []


def test_k_larger_than_matches_returns_only_matches(index):
    hits = index.search("Vostan", 50)
    assert {h.doc_id for h in hits} == {"a", "b"}


def test_batch_equals_single_searches(index):
    queries = ["Kelmora", "", "gardens twin", "Zorvak born", "country coast"]
    assert index.batch_search(queries, 3) == [index.search(q, 3) for q in queries]


def test_scores_match_bm25s(index):
    queries = ["Kelmora harbour", "Zorvak Pellin Kelmora Kelmora"]
    ours = index.scores(queries)
    assert ours.shape == (2, len(DOCS))
    for q, row in zip(queries, ours):
        terms = search._tokenize([q], Stemmer.Stemmer("english"))[0]
        np.testing.assert_allclose(row, index.retriever.get_scores(terms), rtol=1e-6)


def test_cache_is_reused(tmp_path, monkeypatch):
    first = SearchIndex.build(DOCS, cache_dir=tmp_path)
    path = SearchIndex.cache_path(DOCS, tmp_path)
    assert path.parent == tmp_path and len(path.name) == search.CACHE_KEY_CHARS
    assert (path / search._SPEC_FILE).is_file()

    def no_indexing(docs):
        raise AssertionError("re-indexed although the cache holds this corpus")

    monkeypatch.setattr(search, "_index", no_indexing)
    second = SearchIndex.build(list(DOCS), cache_dir=tmp_path)
    for q in ("Kelmora", "gardens", "Zorvak Pellin born"):
        assert second.search(q, 4) == first.search(q, 4)
    # Other content, other key: the monkeypatched indexer proves it is not served from cache.
    with pytest.raises(AssertionError, match="re-indexed"):
        SearchIndex.build(DOCS[:2], cache_dir=tmp_path)


def test_default_cache_dir_comes_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv(search.CACHE_ENV, str(tmp_path / "c"))
    SearchIndex.build(DOCS)
    assert SearchIndex.cache_path(DOCS).is_dir() and SearchIndex.cache_path(DOCS).parent == tmp_path / "c"


def test_corrupt_cache_is_rebuilt(tmp_path):
    path = SearchIndex.cache_path(DOCS, tmp_path)
    path.mkdir(parents=True)
    (path / search._SPEC_FILE).write_text(__import__("json").dumps(search._SPEC))  # spec ok, index files missing
    assert SearchIndex.build(DOCS, cache_dir=tmp_path).search("Vostan", 1)[0].doc_id == "b"


def test_from_data_dir(tmp_path):
    record = QARecord("q", "Where is Kelmora?", ("Vostan",), ("a",), 1, "test")
    write_dataset(tmp_path / "ds", {"dev": [record]}, DOCS)
    index = SearchIndex.from_data_dir(tmp_path / "ds", cache_dir=tmp_path / "cache")
    assert index.search("Kelmora Vostan", 1)[0].doc_id == "a"


def test_empty_corpus_is_refused():
    with pytest.raises(ValueError):
        SearchIndex.build([])


def test_format_hits():
    hits = [Hit("a", "Kelmora", "Kelmora is a city in Vostan.", 2.0, 1), Hit("b", "Vostan", "Vostan is small.", 1.0, 2)]
    assert format_hits(hits) == "Doc 1 (Kelmora): Kelmora is a city in Vostan.\nDoc 2 (Vostan): Vostan is small."
    # Cut at a word boundary: never half a name.
    assert format_hits(hits[:1], max_chars_per_doc=22) == "Doc 1 (Kelmora): Kelmora is a city in"
    assert format_hits(hits[:1], max_chars_per_doc=21) == "Doc 1 (Kelmora): Kelmora is a city in"
    assert format_hits(hits[:1], max_chars_per_doc=3) == "Doc 1 (Kelmora): Kel"
    assert format_hits([]) == ""
    assert format_hits(hits, header=False) == "Kelmora is a city in Vostan.\nVostan is small."
