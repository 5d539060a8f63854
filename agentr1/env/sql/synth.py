"""A synthetic relational world: an SQLite database and questions that need 1-3 queries.

The same world as ``agentr1.env.qa.synth`` (its relations, question phrasing and fresh-name
machinery), stored as tables instead of documents::

    people(name PK, birth_city -> cities, residence_city -> cities,
           employer -> companies, former_employer -> companies)
    cities(name PK, country, trade_partner)
    companies(name PK, headquarters_city -> cities, branch_city -> cities,
              founder -> people, chairman -> people)
    films(title PK, director -> people, producer -> people,
          studio -> companies, distributor -> companies)

Each question gets its own rows with FRESH names (FIELD-NOTES pitfall 1: nothing to memorise,
every hop's value must be copied from a query result into the next query): the chain (the
entity in the question and, hop by hop, the value its relation points to), in each chain row a
distractor column of the same kind (``producer`` beside ``director``) with another fresh name,
a row for each non-final distractor value with a plausible next hop (a wrong column leads
somewhere), and 1-2 look-alike rows (one syllable changed) stating the same relations with
other values. Every name a foreign key holds has its row (NULL where nothing is stated).

A hop's gold query is a primary-key look-up, ``SELECT director FROM films WHERE title =
'Bazolun'``; a record keeps them as its gold calls (``calls``), the hop values as
``gold_values`` (what the environment's process reward looks for in a result) and the hop
details as ``chain``. ``corpus.jsonl`` (every dataset has one) holds one document per table: its
schema in words.

Byte-identical for a seed: one ``random.Random``, lists only, and the database is built in
memory by the same statements in the same order and serialised (same SQLite version).
"""
from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from typing import Sequence

from agentr1.data.records import Document, QARecord
from agentr1.env.qa.synth import (
    DEFAULT_HOP_WEIGHTS,
    DEFAULT_NAMES,
    MAIN_RELATIONS,
    SIZES,
    Name,
    _NameMaker,
    _question_text,
    _World,
    check_hop_weights,
    draw_splits,
    dataset_stats,
    distractor_of,
    kind_id,
    relation_kinds,
    synth_args,
)
from agentr1.env.sql.tool import DB_FILE, SQL_TOOL_NAME

SOURCE = "sql"
LOOKALIKES_PER_QUESTION = (1, 2)


@dataclass(frozen=True)
class Table:
    name: str
    key: str
    """The primary key column: the entity's name."""
    columns: tuple[str, ...]
    """The relation columns, each named after its relation (``agentr1.env.qa.synth``)."""


TABLES: dict[str, Table] = {
    "person": Table("people", "name", ("birth_city", "residence_city", "employer", "former_employer")),
    "city": Table("cities", "name", ("country", "trade_partner")),
    "company": Table("companies", "name", ("headquarters_city", "branch_city", "founder", "chairman")),
    "film": Table("films", "title", ("director", "producer", "studio", "distributor")),
}
"""Entity kind -> its table. Countries are plain values (no table)."""
SQL_RELATIONS = tuple(r for r, (subject, _, distractor) in MAIN_RELATIONS.items()
                      if subject in TABLES and r in TABLES[subject].columns and distractor in TABLES[subject].columns)
"""The questions' relations: those whose subject has a table holding them and their distractor."""


def lookup_query(table: str, key: str, column: str, subject: str) -> str:
    """``column`` of the row whose ``key`` is ``subject`` (quotes in it doubled, as SQL wants)."""
    return f"SELECT {column} FROM {table} WHERE {key} = '{subject.replace(chr(39), chr(39) * 2)}'"


def hop_query(relation: str, subject: str) -> str:
    """The look-up of ``relation`` for ``subject``: a hop's gold query."""
    table = TABLES[relation_kinds(relation)[0]]
    return lookup_query(table.name, table.key, relation, subject)


def schema_sql() -> list[str]:
    """CREATE TABLE statements, foreign keys declared (referenced tables first)."""
    out = []
    for kind in ("city", "person", "company", "film"):
        table = TABLES[kind]
        cols = [f"{table.key} TEXT PRIMARY KEY"]
        for column in table.columns:
            target = TABLES.get(relation_kinds(column)[1])
            cols.append(f"{column} TEXT" + (f" REFERENCES {target.name}({target.key})" if target else ""))
        out.append(f"CREATE TABLE {table.name} ({', '.join(cols)})")
    return out


def schema_docs() -> list[Document]:
    """One document per table: its columns and what they point to."""
    docs = []
    for table in TABLES.values():
        parts = []
        for column in table.columns:
            target = TABLES.get(relation_kinds(column)[1])
            parts.append(f"{column} ({'a ' + target.key + ' in ' + target.name if target else 'a name'})")
        docs.append(Document(f"table-{table.name}", table.name,
                             f"Table {table.name}: one row per {table.key}; columns {', '.join(parts)}."))
    return docs


class _Rows:
    """The rows of every table, in insertion order; a row is {column: value}."""

    def __init__(self):
        self.rows: dict[str, dict[str, dict[str, str]]] = {t.name: {} for t in TABLES.values()}

    def put(self, kind: str, name: str, values: dict[str, str]) -> None:
        self.rows[TABLES[kind].name].setdefault(name, {}).update(values)

    def complete(self) -> None:
        """A row (NULLs but its name) for every referenced name that has none: foreign keys hold."""
        for kind, table in TABLES.items():
            for values in list(self.rows[table.name].values()):
                for column, value in values.items():
                    target = relation_kinds(column)[1]
                    if target in TABLES and value not in self.rows[TABLES[target].name]:
                        self.put(target, value, {})


def _hop_row(rows: _Rows, names: _NameMaker, entity: Name, relation: str) -> tuple[Name, Name]:
    """``entity``'s row stating ``relation`` and its distractor, fresh values: (value, decoy)."""
    value = names.new(relation_kinds(relation)[1])
    decoy = names.new(relation_kinds(distractor_of(relation))[1])
    rows.put(relation_kinds(relation)[0], entity.text, {relation: value.text, distractor_of(relation): decoy.text})
    return value, decoy


def _paths(hops: int) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = [(r,) for r in SQL_RELATIONS]
    for _ in range(hops - 1):
        paths = [p + (r,) for p in paths for r in SQL_RELATIONS
                 if relation_kinds(r)[0] == relation_kinds(p[-1])[1]]
    return paths


def _question(rng: random.Random, names: _NameMaker, rows: _Rows, qid: str, path: tuple[str, ...]) -> QARecord:
    entity = names.new(relation_kinds(path[0])[0])
    chain, hop_entities = [], []
    for i, relation in enumerate(path):
        value, decoy = _hop_row(rows, names, entity, relation)
        table = TABLES[relation_kinds(relation)[0]]
        chain.append({"relation": relation, "table": table.name, "key": table.key, "subject": entity.text,
                      "column": relation, "distractor_column": distractor_of(relation), "answer": value.text,
                      "distractor_answer": decoy.text, "query": hop_query(relation, entity.text)})
        hop_entities.append((entity, relation))
        if i + 1 < len(path):
            # The distractor value leads on: an agent that copied it reads a fluent wrong answer.
            _hop_row(rows, names, decoy, path[i + 1])
        entity = value
    for original, relation in rng.sample(hop_entities, min(len(hop_entities), rng.choice(LOOKALIKES_PER_QUESTION))):
        _hop_row(rows, names, names.lookalike(original), relation)
    question = _question_text(rng, path, chain[0]["subject"])
    meta = {
        "kind": kind_id(path),
        "calls": [{"name": SQL_TOOL_NAME, "arguments": {"query": hop["query"]}} for hop in chain],
        "gold_values": [hop["answer"] for hop in chain],
        "chain": chain,
    }
    tables = list(dict.fromkeys(f"table-{hop['table']}" for hop in chain))
    return QARecord(qid, question, (chain[-1]["answer"],), tuple(tables), len(path), SOURCE, meta)


def build_database(rows: _Rows, rng: random.Random) -> bytes:
    """The database file's bytes: the schema, then each table's rows in a seeded order."""
    conn = sqlite3.connect(":memory:")
    try:
        for statement in schema_sql():
            conn.execute(statement)
        for kind in ("city", "person", "company", "film"):
            table = TABLES[kind]
            names = list(rows.rows[table.name])
            rng.shuffle(names)  # a row's position says nothing about its question
            columns = (table.key, *table.columns)
            conn.executemany(f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                             [(n, *(rows.rows[table.name][n].get(c) for c in table.columns)) for n in names])
        conn.commit()
        conn.execute("VACUUM")
        return conn.serialize()
    finally:
        conn.close()


def generate(
    seed: int,
    n_train: int = SIZES.n_train,
    n_dev: int = SIZES.n_dev,
    n_test: int = SIZES.n_test,
    hop_weights: Sequence[float] = DEFAULT_HOP_WEIGHTS,
    names: str = DEFAULT_NAMES,
) -> tuple[dict[str, list[QARecord]], list[Document], dict[str, bytes]]:
    """The SQL dataset for ``seed``: (splits, corpus, {DB_FILE: database bytes}); arguments as
    ``agentr1.env.qa.synth.generate``'s. Byte-identical for a seed."""
    check_hop_weights(hop_weights)
    world = _World(seed, names)  # the QA world's seeded rng and name maker, drawn in the same order
    rng, maker = world.rng, world.names
    rows = _Rows()
    drafts = draw_splits(rng, (n_train, n_dev, n_test), hop_weights, _paths,
                         lambda split, i, path: _question(rng, maker, rows, f"sql-{split}-{i:05d}", path))
    splits = {split: records for split, records in drafts.items() if records}  # an empty split file is invalid data
    rows.complete()
    return splits, schema_docs(), {DB_FILE: build_database(rows, rng)}


def sql_stats(splits: dict[str, list[QARecord]], corpus: Sequence[Document], files: dict[str, bytes]) -> dict:
    """``synth.dataset_stats`` plus the database's size and row counts."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(files[DB_FILE])
        counts = {t.name: conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0] for t in TABLES.values()}
    finally:
        conn.close()
    return {**dataset_stats(splits, corpus), "db_bytes": len(files[DB_FILE]), "db_rows": counts}


def generate_from_config(cfg):
    """The ``sql`` environment's generator: :func:`generate` with ``cfg.data.synth``."""
    return generate(**synth_args(cfg))
