"""A mixed world: some facts in documents (the ``search`` tool), others in the database (``sql``).

The example of several tools in one episode. Where a fact lives follows its subject's kind, so
a question says which tool each hop needs: facts about films and companies are stated in
documents (``agentr1.env.qa.synth``'s templates, a distractor relation in each), facts about
people and cities are rows of the database (``agentr1.env.sql.synth``'s tables, a distractor
column in each). "In which country was the director of Vemundur born?" is a search (the film's
document names its director), then two queries (the director's birth city, that city's
country). Every hop's value is fresh, a wrong value leads on through a document or row of its
own, and each question has 1-2 look-alike documents or rows, as in the two worlds it joins.

Records: ``supporting_docs`` are the documents of the search hops; ``gold_values`` every hop's
value; ``calls`` the gold calls (a search of the hop's entity, or the hop's look-up); ``chain``
per hop its ``tool`` plus that world's hop fields. Byte-identical for a seed.
"""
from __future__ import annotations

from typing import Sequence

from agentr1.data.records import Document, QARecord
from agentr1.env.sql.synth import (
    TABLES,
    _hop_row,
    _paths,
    _Rows,
    build_database,
    hop_query,
    schema_docs,
)
from agentr1.env.qa.synth import (
    DEFAULT_NAMES,
    LOOKALIKES_PER_QUESTION,
    SIZES,
    Name,
    _corpus,
    _question_text,
    _World,
    check_hop_weights,
    draw_splits,
    distractor_of,
    kind_id,
    relation_kinds,
    synth_args,
)
from agentr1.env.protocol import SEARCH_TOOL_NAME
from agentr1.env.sql.tool import DB_FILE, SQL_TOOL_NAME

SOURCE = "mixed"
DOCUMENT_KINDS = ("film", "company")
"""Subjects whose facts are documents; the others' are database rows."""
DEFAULT_HOP_WEIGHTS = (0.0, 0.5, 0.5)
"""2- and 3-hop questions: a 1-hop question uses one tool."""


def tool_of(relation: str) -> str:
    return SEARCH_TOOL_NAME if relation_kinds(relation)[0] in DOCUMENT_KINDS else SQL_TOOL_NAME


def _hop(world: _World, rows: _Rows, entity: Name, relation: str) -> tuple[Name, Name, int | None]:
    """State ``relation`` of ``entity`` where its kind's facts live: (value, decoy, doc key or None)."""
    if tool_of(relation) == SEARCH_TOOL_NAME:
        key, value, decoy = world.hop_doc(entity, relation_kinds(relation)[0], relation)
        return value, decoy, key
    value, decoy = _hop_row(rows, world.names, entity, relation)
    return value, decoy, None


def _question(world: _World, rows: _Rows, qid: str, path: tuple[str, ...]) -> tuple[QARecord, list]:
    """The record (doc ids still draft keys, fixed by :func:`_finish`) and its chain."""
    rng = world.rng
    entity = world.names.new(relation_kinds(path[0])[0])
    chain, hops = [], []
    for i, relation in enumerate(path):
        value, decoy, key = _hop(world, rows, entity, relation)
        tool = tool_of(relation)
        query = entity.text if tool == SEARCH_TOOL_NAME else hop_query(relation, entity.text)
        table = TABLES[relation_kinds(relation)[0]]
        chain.append({"tool": tool, "query": query, "doc_id": key, "relation": relation, "table": table.name,
                      "key": table.key, "subject": entity.text, "column": relation,
                      "distractor_column": distractor_of(relation), "distractor_relation": distractor_of(relation),
                      "answer": value.text, "distractor_answer": decoy.text})
        hops.append((entity, relation))
        if i + 1 < len(path):
            _hop(world, rows, decoy, path[i + 1])  # a wrong value leads on
        entity = value
    for original, relation in rng.sample(hops, min(len(hops), rng.choice(LOOKALIKES_PER_QUESTION))):
        _hop(world, rows, world.names.lookalike(original), relation)
    meta = {"kind": kind_id(path), "chain": chain, "gold_values": [h["answer"] for h in chain],
            "calls": [{"name": h["tool"], "arguments": {"query": h["query"]}} for h in chain]}
    return QARecord(qid, _question_text(rng, path, chain[0]["subject"]), (chain[-1]["answer"],), (), len(path),
                    SOURCE, meta), chain


def _finish(record: QARecord, doc_ids: list[str]) -> QARecord:
    chain = [{**h, "doc_id": doc_ids[h["doc_id"]] if h["doc_id"] is not None else None} for h in record.meta["chain"]]
    support = tuple(h["doc_id"] for h in chain if h["doc_id"] is not None)
    return QARecord(record.id, record.question, record.answers, support, record.hops, record.source,
                    {**record.meta, "chain": chain})


def generate(
    seed: int,
    n_train: int = SIZES.n_train,
    n_dev: int = SIZES.n_dev,
    n_test: int = SIZES.n_test,
    hop_weights: Sequence[float] = DEFAULT_HOP_WEIGHTS,
    names: str = DEFAULT_NAMES,
) -> tuple[dict[str, list[QARecord]], list[Document], dict[str, bytes]]:
    """The mixed dataset for ``seed``: (splits, documents + table schemas, {DB_FILE: bytes})."""
    check_hop_weights(hop_weights)
    world, rows = _World(seed, names), _Rows()
    drafts = draw_splits(world.rng, (n_train, n_dev, n_test), hop_weights, _paths,
                         lambda split, i, path: _question(world, rows, f"mixed-{split}-{i:05d}", path)[0])
    doc_ids, corpus = _corpus(world)
    splits = {split: [_finish(r, doc_ids) for r in records] for split, records in drafts.items() if records}
    rows.complete()
    return splits, corpus + schema_docs(), {DB_FILE: build_database(rows, world.rng)}


def generate_from_config(cfg):
    """The ``mixed`` environment's generator: :func:`generate` with ``cfg.data.synth``."""
    return generate(**synth_args(cfg))

