"""The synthetic world: determinism, the meta contract, readable docs, and searchable names."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from agentr1.env.qa import synth
from agentr1.data.records import to_jsonl
from agentr1.env.qa.synth import (
    DOC_TEMPLATES,
    MAIN_RELATIONS,
    dataset_stats,
    extract_relation,
    generate,
    majority_baseline_em,
    relation_paths,
)
from agentr1.env.qa.search import SearchIndex

SMALL = dict(n_train=200, n_dev=20, n_test=30)
PLAIN_TEXT = re.compile(r"^[A-Za-z ,.?]+$")


@pytest.fixture(scope="module", params=sorted(synth.NAME_INVENTORIES))
def world(request):
    splits, corpus = generate(7, **SMALL, names=request.param)
    return splits, corpus, {d.id: d for d in corpus}


def _all_records(splits):
    return [r for records in splits.values() for r in records]


def _dump(splits, corpus) -> str:
    return to_jsonl(d.to_json() for d in corpus) + "".join(
        to_jsonl(r.to_json() for r in records) for records in splits.values()
    )


def test_byte_identical_for_a_seed_and_different_for_another():
    a, b, c = (generate(seed, n_train=40, n_dev=5, n_test=5) for seed in (3, 3, 4))
    assert _dump(*a) == _dump(*b)
    assert _dump(*a) != _dump(*c)


def test_split_sizes_and_hop_shares(world):
    splits, _, _ = world
    assert {k: len(v) for k, v in splits.items()} == {"train": 200, "dev": 20, "test": 30}
    assert Counter(r.hops for r in splits["train"]) == {1: 50, 2: 70, 3: 80}
    assert Counter(r.hops for r in splits["test"]) == {1: 8, 2: 10, 3: 12}
    only_two = generate(1, n_train=10, n_dev=0, n_test=0, hop_weights=(0, 1))[0]
    assert {r.hops for r in only_two["train"]} == {2}


def test_meta_follows_the_contract(world):
    splits, _, docs = world
    for r in _all_records(splits):
        chain = r.meta["chain"]
        assert len(chain) == r.hops
        assert r.meta["kind"] == ">".join([MAIN_RELATIONS[chain[0]["relation"]][0]] + [h["relation"] for h in chain])
        assert r.supporting_docs == tuple(h["doc_id"] for h in chain)
        assert r.answers == (chain[-1]["answer"],) and r.source == "synthetic"
        assert chain[0]["query"] in r.question
        for hop, nxt in zip(chain, chain[1:]):
            assert hop["answer"] == nxt["query"]
        for hop in chain:
            assert set(hop) == {"query", "doc_id", "relation", "answer", "distractor_relation", "distractor_answer"}
            assert docs[hop["doc_id"]].title == hop["query"]
            assert hop["distractor_relation"] == MAIN_RELATIONS[hop["relation"]][2]
            assert hop["distractor_answer"] != hop["answer"]
        assert 1 <= len(r.meta["distractor_docs"]) <= 2
        assert len(r.meta["decoy_docs"]) == r.hops - 1


def test_chain_docs_state_the_values_the_chain_says(world):
    splits, _, docs = world
    for r in _all_records(splits):
        for hop in r.meta["chain"]:
            text = docs[hop["doc_id"]].text
            assert extract_relation(text, hop["relation"]) == hop["answer"]
            assert extract_relation(text, hop["distractor_relation"]) == hop["distractor_answer"]
            assert extract_relation(text, hop["relation"], subject=hop["query"]) == hop["answer"]
            assert extract_relation(text, hop["relation"], subject="Nobody Here") is None


def _similar(a: str, b: str) -> bool:
    """Same first word, or the same words but one of them differs."""
    wa, wb = a.split(), b.split()
    return a != b and (wa[0] == wb[0] or (len(wa) == len(wb) and sum(x != y for x, y in zip(wa, wb)) == 1))


def test_lookalikes_have_similar_names_and_other_facts(world):
    splits, _, docs = world
    for r in _all_records(splits):
        for doc_id in r.meta["distractor_docs"]:
            look = docs[doc_id]
            # (a company suffix can make another hop look similar too: one must match fully)
            mimicked = [
                h for h in r.meta["chain"]
                if _similar(h["query"], look.title) and extract_relation(look.text, h["relation"]) is not None
            ]
            assert mimicked, (look.title, [h["query"] for h in r.meta["chain"]])
            assert all(extract_relation(look.text, h["relation"]) != h["answer"] for h in mimicked)


def test_decoy_docs_continue_the_wrong_path(world):
    splits, _, docs = world
    for r in _all_records(splits):
        chain = r.meta["chain"]
        for hop, nxt, decoy_id in zip(chain, chain[1:], r.meta["decoy_docs"]):
            decoy = docs[decoy_id]
            assert decoy.title == hop["distractor_answer"]
            assert extract_relation(decoy.text, nxt["relation"]) not in (None, nxt["answer"])


def test_names_are_unique_and_text_is_plain(world):
    splits, corpus, _ = world
    titles = [d.title for d in corpus]
    assert len(set(titles)) == len(titles)
    answers = [r.answers[0] for r in _all_records(splits)]
    assert len(set(answers)) == len(answers)
    for d in corpus:
        assert PLAIN_TEXT.match(d.text) and PLAIN_TEXT.match(d.title)
        assert synth.MIN_DOC_WORDS <= len(d.text.split()) <= synth.MAX_DOC_WORDS, d.text
    for r in _all_records(splits):
        assert PLAIN_TEXT.match(r.question), r.question
    questions = [r.question for r in _all_records(splits)]
    assert len(set(questions)) == len(questions)


def test_no_name_is_shared_between_questions(world):
    splits, _, docs = world
    owner: dict[str, str] = {}
    for r in _all_records(splits):
        names = {h["query"] for h in r.meta["chain"]} | {r.answers[0]}
        names |= {docs[d].title for d in r.meta["distractor_docs"] + r.meta["decoy_docs"]}
        for name in names:
            assert owner.setdefault(name, r.id) == r.id


def test_question_phrasings_vary(world):
    splits, _, _ = world
    one_hop_director = [r.question for r in _all_records(splits) if r.meta["kind"] == "film>director"]
    frames = {re.sub(r"[A-Z][a-z]+(?: [A-Z][a-z]+)*\?$", "X?", q) for q in one_hop_director}
    assert len(frames) >= 2, frames


def test_templates_never_read_as_another_relation():
    relations = list(DOC_TEMPLATES)
    for relation in relations:
        for template in DOC_TEMPLATES[relation]:
            sentence = template.format(s="Kelmo Vastar", o="Brim Tolu Group")
            assert extract_relation(sentence, relation) == "Brim Tolu Group", sentence
            for other in relations:
                if other != relation:
                    assert extract_relation(sentence, other) is None, (sentence, other)


def test_extract_reads_the_earliest_statement_in_a_search_body():
    body = "Doc 1 (Abo): Abo was directed by Kim Sol.\nDoc 2 (Abu): Tam Rel directed Abu."
    assert extract_relation(body, "director") == "Kim Sol"
    assert extract_relation(body, "director", subject="Abu") == "Tam Rel"
    assert extract_relation(body, "no_such_relation") is None


def test_relation_paths_compose():
    assert len(relation_paths(1)) == len(MAIN_RELATIONS)
    for hops in (2, 3):
        for path in relation_paths(hops):
            for a, b in zip(path, path[1:]):
                assert MAIN_RELATIONS[a][1] == MAIN_RELATIONS[b][0]


def test_exact_name_search_returns_own_doc_first(world, tmp_path):
    """The look-alikes (and docs that mention the name) must never outrank the entity's doc."""
    splits, corpus, docs = world
    index = SearchIndex.build(corpus, cache_dir=tmp_path)
    queries, wanted = [], []
    for r in _all_records(splits):
        for hop in r.meta["chain"]:
            queries.append(hop["query"])
            wanted.append(hop["doc_id"])
        for doc_id in r.meta["distractor_docs"] + r.meta["decoy_docs"]:
            queries.append(docs[doc_id].title)
            wanted.append(doc_id)
    assert len(queries) > 600
    firsts = [hits[0].doc_id for hits in index.batch_search(queries, 3)]
    misses = [q for q, want, got in zip(queries, wanted, firsts) if want != got]
    assert misses == []


def test_small_inventory_names_are_one_word_of_three_short_syllables():
    inv = synth.NAME_INVENTORIES["small"]
    syllables = {o + v + c for o in inv.onsets for v in inv.vowels for c in inv.codas}
    assert max(len(x) for x in syllables) <= 3 and len(syllables) <= 300
    splits, corpus = generate(3, n_train=50, n_dev=5, n_test=5, names="small")
    word = re.compile("(?:%s){3}" % "|".join(sorted(syllables, key=len, reverse=True)), re.IGNORECASE)
    for r in _all_records(splits):
        for hop in r.meta["chain"]:
            assert word.fullmatch(hop["answer"]) and word.fullmatch(hop["query"]), hop


def test_config_and_cli_offer_exactly_the_generator_inventories():
    from typing import get_args

    from agentr1.config import SynthConfig

    assert set(get_args(SynthConfig.model_fields["names"].annotation)) == set(synth.NAME_INVENTORIES)
    assert SynthConfig().names == synth.DEFAULT_NAMES


def test_unknown_name_inventory_is_refused():
    with pytest.raises(ValueError, match="unknown name inventory"):
        generate(0, n_train=1, n_dev=1, n_test=1, names="huge")


def test_stats_and_chance_level(world):
    splits, corpus, _ = world
    stats = dataset_stats(splits, corpus)
    assert stats["splits"]["train"] == {"n": 200, "hops": {"1": 50, "2": 70, "3": 80}}
    assert stats["n_docs"] == len(corpus)
    assert synth.MIN_DOC_WORDS <= stats["avg_doc_words"] <= synth.MAX_DOC_WORDS
    assert stats["majority_answer_em_test"] == 0.0
    train, test = splits["train"], splits["test"]
    # A test set whose answers all equal the top train answer scores 1.
    assert majority_baseline_em(train[:1], train[:1]) == 1.0
    assert majority_baseline_em([], test) == 0.0
