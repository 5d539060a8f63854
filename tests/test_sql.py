"""The sql tool (agentr1/env/sql/tool.py): read-only, bounded, errors as observations; and the fuzz
test of the issue: >= 10,000 hostile queries through the environment's step_batch leave the
database file as it was, stop within their step budget, and never raise."""
from __future__ import annotations

import hashlib
import json
import os
import random
import time

import pytest

from agentr1.config import EnvConfig, RewardConfig
from agentr1.data.generated import write_dataset
from agentr1.data.records import QARecord
from agentr1.env.sql.synth import TABLES, generate
from agentr1.env.base import EnvSettings
from agentr1.env.protocol import format_call
from agentr1.env.rewards import RewardWeights
from agentr1.env.sql.tool import DB_FILE, MAX_VALUE_BYTES, SQLTool
from agentr1.env.sql.env import SQLEnv
from agentr1.env.tools import Tool, ToolError

FUZZ_QUERIES = 10_000
FUZZ_VM_STEPS = 1_000_000
"""A small budget (~10 ms of work) keeps the fuzz's never-ending queries short."""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    data = tmp_path_factory.mktemp("sqlw") / "data"
    splits, corpus, files = generate(5, n_train=60, n_dev=5, n_test=10)
    write_dataset(data, splits, corpus, files=files)
    return data, splits


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _env(tool: SQLTool, **env) -> SQLEnv:
    settings = EnvSettings.from_config(EnvConfig(system_prompt="", **{"max_turns": 10**9, **env}))
    return SQLEnv([Tool.from_callable(tool)], settings, RewardWeights.from_config(RewardConfig()))


def _record(splits) -> QARecord:
    return splits["train"][0]


def test_rows_come_back_as_compact_text_with_their_values_as_keys(world):
    data, splits = world
    hop = splits["train"][0].meta["chain"][0]
    out = SQLTool(data / DB_FILE)(hop["query"])
    assert out.text == f"{hop['column']}\n{hop['answer']}"
    assert out.keys == (hop["answer"],)
    empty = SQLTool(data / DB_FILE)("SELECT name FROM people WHERE name = 'Nobody'")
    assert empty.text == "name\n(no rows)" and empty.keys == ()


def test_row_and_character_limits_are_stated_when_they_cut(world):
    data, _ = world
    tool = SQLTool(data / DB_FILE, max_rows=3, max_chars=1000)
    out = tool("SELECT name FROM people")
    lines = out.text.split("\n")
    assert len(lines) == 5 and len(out.keys) == 3
    assert lines[-1] == "(cut: the first 3 rows shown; at most 3 rows and 1000 characters are)"
    narrow = SQLTool(data / DB_FILE, max_rows=10, max_chars=30)("SELECT name, birth_city FROM people")
    assert len(narrow.text.split("\n")[-1]) and "at most 10 rows and 30 characters" in narrow.text
    assert sum(len(line) + 1 for line in narrow.text.split("\n")[:-1]) <= 31
    # a wide join's header alone is longer than the limit: it is cut too (it came back whole)
    wide = SQLTool(data / DB_FILE, max_rows=10, max_chars=120)(
        "SELECT * FROM films a, films b, films c, films d, films e, films f LIMIT 1")
    assert len(wide.text.split("\n")[0]) <= 120 and "at most 10 rows and 120 characters" in wide.text


@pytest.mark.parametrize("query", [
    "INSERT INTO people (name) VALUES ('X')", "UPDATE people SET name = 'X'", "DELETE FROM films",
    "DROP TABLE films", "CREATE TEMP TABLE t (a)", "CREATE TEMP VIEW v AS SELECT 1", "ALTER TABLE films ADD c",
    "ATTACH DATABASE ':memory:' AS other", "PRAGMA query_only = 0", "PRAGMA table_info(films)",
    "SELECT load_extension('libfoo')", "SELECT randomblob(1000000000)", "SELECT printf('%.*c', 100000000, 'x')",
    "BEGIN", "SAVEPOINT a", "ANALYZE", "REINDEX", "SELECT 1; DROP TABLE films", "SELECT random()",
])
def test_anything_but_reading_is_refused_with_sqlite_s_reason(world, query):
    data, _ = world
    before = _sha(data / DB_FILE)
    with pytest.raises(ToolError, match="SQL error"):
        SQLTool(data / DB_FILE)(query)
    assert _sha(data / DB_FILE) == before


def test_vacuum_into_writes_no_file(world, tmp_path):
    data, _ = world
    target = tmp_path / "copy.db"
    with pytest.raises(ToolError):
        SQLTool(data / DB_FILE)(f"VACUUM INTO '{target}'")
    assert not target.exists()


def test_a_query_that_never_ends_stops_at_its_step_budget(world):
    data, _ = world
    tool = SQLTool(data / DB_FILE, vm_steps=100_000)
    with pytest.raises(ToolError, match="more than 100,000 steps"):
        tool("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    # The connection is usable afterwards, with a fresh budget.
    assert tool("SELECT count(*) FROM films").keys


COUNT_TO = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) SELECT count(*) FROM c"


def _busy() -> None:
    while True:
        pass


def _beside_busy_processes(run):
    """``run()`` while 4 busy loops compete for this machine's cores."""
    import multiprocessing as mp

    busy = [mp.get_context("fork").Process(target=_busy, daemon=True) for _ in range(4)]
    for p in busy:
        p.start()
    try:
        return run()
    finally:
        for p in busy:
            p.kill()
            p.join()


def test_the_step_budget_not_the_machine_load_decides(world):
    """A query just inside its budget succeeds and one just past it fails, the same on an idle
    machine and beside busy processes: the outcome (observation, reward) cannot depend on load."""
    data, _ = world
    tool = SQLTool(data / DB_FILE, vm_steps=2_000_000)
    steps_per_row = 8  # a recursive CTE's row here takes fewer than this many VM instructions
    inside, past = COUNT_TO.format(n=2_000_000 // (4 * steps_per_row)), COUNT_TO.format(n=2_000_000)

    def outcomes() -> list[str]:
        out = []
        for q in (inside, past, inside):
            try:
                out.append(tool(q).text)
            except ToolError as err:
                out.append(f"error: {err}")
        return out

    idle = outcomes()
    loaded = _beside_busy_processes(outcomes)
    assert idle == loaded
    assert not idle[0].startswith("error") and idle[1].startswith("error: the query ran more than 2,000,000 steps")


def _instr_loop(chars: int, calls: int) -> str:
    """A query whose every step is as dear as a value of ``chars`` characters allows: ``calls``
    quadratic ``instr`` scans per row (a needle of half the string, ending in a character the
    string lacks), over 100,000 rows."""
    def tree(k: int) -> str:  # a balanced sum stays within SQLite's expression depth
        return "instr(substr(s, i % 2), substr(s, 1, length(s) / 2) || 'b')" if k == 1 \
            else f"({tree(k // 2)} + {tree(k - k // 2)})"
    return (f"WITH RECURSIVE d(s) AS (SELECT 'a' UNION ALL SELECT s || s FROM d WHERE length(s) * 2 <= {chars}), "
            f"b(s) AS (SELECT max(s) || substr(max(s), 1, {chars} - length(max(s))) FROM d), "
            f"r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 100000) SELECT sum({tree(calls)}) AS v FROM r, b")


def test_dear_steps_end_at_the_same_limit_idle_and_beside_busy_processes(tmp_path, monkeypatch):
    """Work, not time, decides: a query whose steps are made as expensive as the value cap
    allows ends at its step budget, and one that needs longer values is refused at once, with
    the same observation and reward through the sandboxed tool (its default CPU and wall limits)
    idle and beside 4 busy processes. With 100 KB values and 10M steps the second query was
    stopped by the CPU limit idle and by the wall limit under load (issue 48)."""
    from agentr1.config import load_config
    from agentr1.env.registry import build_env, resolve

    splits, corpus, files = generate(0, 8, 2, 2)
    write_dataset(tmp_path / "data-sql", splits, corpus, files=files)
    monkeypatch.chdir(tmp_path)
    env = build_env(resolve(load_config(None, ["env.kind=sql", "data.dir=data-sql", "env.max_query_chars=5000",
                                               "env.max_turns=100"])), "data-sql")
    queries = {"dear": _instr_loop(MAX_VALUE_BYTES - 100, 64), "long": _instr_loop(32_768, 8)}

    def outcomes() -> dict[str, tuple[str, float]]:
        state = env.reset(splits["train"][0])
        out = {}
        for name, query in queries.items():
            result = env.step(state, format_call("sql", {"query": query}))
            out[name] = (result.observation, result.process_reward)
        return out

    idle = outcomes()
    loaded = _beside_busy_processes(outcomes)
    assert idle == loaded, (idle, loaded)
    assert "ran more than 2,000,000 steps" in idle["dear"][0], idle["dear"][0]
    assert "too big" in idle["long"][0], idle["long"][0]


def test_a_value_larger_than_the_limit_is_an_error_not_an_allocation(world):
    data, _ = world
    with pytest.raises(ToolError, match="too big"):
        SQLTool(data / DB_FILE)(f"WITH RECURSIVE s(x) AS (SELECT 'ab' UNION ALL SELECT x || x FROM s "
                                f"WHERE length(x) < {MAX_VALUE_BYTES * 4}) SELECT length(max(x)) FROM s")


def test_a_failed_query_is_the_observation_and_the_bad_call_penalty(world):
    data, splits = world
    env = _env(SQLTool(data / DB_FILE))
    state = env.reset(_record(splits))
    result = env.step(state, format_call("sql", {"query": "SELECT nope FROM films"}))
    assert result.observation.startswith("Error: tool 'sql' failed: SQL error: no such column: nope")
    assert result.info["bad_call"] == 1.0 and result.info["tool_error"] == 1.0
    assert result.process_reward == pytest.approx(RewardConfig().process_bad_call)


# ---------------------------------------------------------------- the fuzz test

_WRITES = ["INSERT INTO {t} ({k}) VALUES ('{v}')", "INSERT OR REPLACE INTO {t} ({k}) VALUES ('{v}')",
           "REPLACE INTO {t} ({k}) VALUES ('{v}')", "UPDATE {t} SET {c} = '{v}'", "UPDATE {t} SET {c} = NULL WHERE {k} = '{v}'",
           "DELETE FROM {t}", "DELETE FROM {t} WHERE {k} = '{v}'", "DROP TABLE {t}", "DROP TABLE IF EXISTS {t}",
           "ALTER TABLE {t} RENAME TO {v}", "ALTER TABLE {t} ADD COLUMN {v} TEXT", "CREATE TABLE {v} (a)",
           "CREATE TEMP TABLE {v} AS SELECT * FROM {t}", "CREATE INDEX {v} ON {t} ({c})", "CREATE VIEW {v} AS SELECT 1",
           "CREATE TRIGGER {v} AFTER INSERT ON {t} BEGIN DELETE FROM {t}; END", "DROP INDEX IF EXISTS {v}",
           "WITH x AS (SELECT 1) INSERT INTO {t} ({k}) SELECT 'a' FROM x", "SELECT 1; DELETE FROM {t}",
           "BEGIN; DELETE FROM {t}; COMMIT", "VACUUM", "VACUUM INTO '{dir}/{v}.db'", "REINDEX", "ANALYZE",
           "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK", "SAVEPOINT {v}", "RELEASE {v}", "DETACH DATABASE main"]
_ATTACH = ["ATTACH DATABASE '{dir}/{v}.db' AS {v}", "ATTACH ':memory:' AS {v}", "ATTACH DATABASE 'file:{v}?mode=rwc' AS x",
           "ATTACH '{dir}/world.sqlite' AS w"]
_PRAGMA = ["PRAGMA query_only = 0", "PRAGMA writable_schema = 1", "PRAGMA journal_mode = WAL", "PRAGMA user_version = 7",
           "PRAGMA foreign_keys = ON", "PRAGMA table_info({t})", "PRAGMA integrity_check", "PRAGMA temp_store = FILE",
           "PRAGMA cache_size = -1000000", "PRAGMA mmap_size = 1000000", "SELECT * FROM pragma_table_info('{t}')",
           "SELECT * FROM pragma_database_list"]
_EXTENSION = ["SELECT load_extension('{v}')", "SELECT load_extension('/lib/x86_64-linux-gnu/libc.so.6', 'system')",
              "SELECT fts5('{v}')", "SELECT readfile('/etc/passwd')", "SELECT writefile('{dir}/{v}', 'x')",
              "SELECT edit('{v}')", "SELECT randomblob(1000000000)", "SELECT zeroblob(2000000000)",
              "SELECT printf('%.*c', 2000000000, 'x')", "SELECT format('%0999999999d', 1)", "SELECT random()",
              "SELECT sqlite_version()", "SELECT hex(randomblob(16))"]
_FOREVER = ["WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x FROM c) SELECT x FROM c ORDER BY x",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c WHERE x < 0",
            "WITH RECURSIVE c(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM c) SELECT group_concat(x) FROM c",
            "SELECT count(*) FROM people, cities, companies, films",
            "SELECT a.name FROM people a, people b, people c WHERE a.name || b.name = c.name",
            "SELECT * FROM people a, people b ORDER BY a.name || b.name DESC",
            "SELECT count(*) FROM {t} a, {t} b, {t} c WHERE a.{k} < b.{k}",
            "SELECT group_concat(a.name || b.name) FROM people a, cities b"]
_READS = ["SELECT {c} FROM {t} WHERE {k} = '{v}'", "SELECT * FROM {t} LIMIT {n}", "SELECT count(*) FROM {t}",
          "SELECT {k}, {c} FROM {t} WHERE {c} LIKE '{v}%'", "SELECT max({k}) FROM {t}", "SELECT sql FROM sqlite_master",
          "SELECT upper({k}), length({c}) FROM {t} ORDER BY {k} LIMIT {n}", "SELECT CAST(x'ff00fe' AS TEXT)",
          "SELECT x'00ff', 1e308 * 10, -9223372036854775808, 'a''b'", "SELECT {c} FROM {t} WHERE {k} = ?",
          "SELECT {c} FROM {t} WHERE {k} IN (SELECT {k} FROM {t} LIMIT 3)", "VALUES (1, 2), (3, 4)",
          "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
          "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5) SELECT sum(x) FROM c",
          "SELECT replace(hex(name), '', 'x') FROM people LIMIT 2", "SELECT '{big}'"]


def _fuzz_query(rng: random.Random, tmp_dir: str) -> tuple[str, str]:
    """(category, query text): a random hostile or ordinary query."""
    table = rng.choice(list(TABLES.values()))
    fill = {"t": table.name, "k": table.key, "c": rng.choice(table.columns), "n": rng.choice([1, 5, 1000]),
            "v": "".join(rng.choice("abcxyz_") for _ in range(rng.randint(1, 8))) or "v", "dir": tmp_dir,
            "big": "x" * rng.choice([10, 5000])}
    roll = rng.random()
    if roll < 0.025:
        return "forever", rng.choice(_FOREVER).format(**fill)
    if roll < 0.03:  # 1 MB strings: a literal, and a value SQLite would have to build
        return "huge", rng.choice(["SELECT '" + "y" * 1_000_000 + "'", "SELECT length('" + "\u00e9" * 500_000 + "')",
                                   "INSERT INTO films (title) VALUES ('" + "z" * 1_000_000 + "')"])
    if roll < 0.25:
        return "write", rng.choice(_WRITES).format(**fill)
    if roll < 0.33:
        return "attach", rng.choice(_ATTACH).format(**fill)
    if roll < 0.43:
        return "pragma", rng.choice(_PRAGMA).format(**fill)
    if roll < 0.53:
        return "extension", rng.choice(_EXTENSION).format(**fill)
    if roll < 0.63:  # text that is not valid UTF-8 once it reaches SQLite, NULs, raw bytes
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        return "bytes", rng.choice([
            "SELECT '" + raw.decode("utf-8", "surrogateescape") + "'",
            "SELECT '\ud800' || name FROM people", "SELECT 1\x00; DROP TABLE films",
            raw.decode("latin-1"), "SELECT CAST(x'" + raw.hex() + "' AS TEXT)"])
    if roll < 0.78:  # keyword soup
        words = ["SELECT", "FROM", "WHERE", "DROP", "TABLE", "(", ")", ",", ";", "'", "*", table.name, table.key,
                 "UNION", "WITH", "RECURSIVE", "PRAGMA", "ATTACH", "--", "/*", "x", "1", "=", "INSERT", "INTO"]
        return "soup", " ".join(rng.choice(words) for _ in range(rng.randint(1, 15)))
    return "read", rng.choice(_READS).format(**fill)


# The step's CPU and wall-clock times are printed, not asserted: the budget is counted in VM steps
# (test_the_step_budget_not_the_machine_load_decides), and a timing depends on the machine.
_REFUSED = {"write", "attach", "pragma"}
"""Categories where every query must be refused (a bad call); for the others SQLite decides."""


@pytest.mark.slow
def test_fuzz_ten_thousand_hostile_queries_through_the_environment(world, tmp_path):
    data, splits = world
    db = data / DB_FILE
    before, files_before = _sha(db), sorted(p.name for p in data.iterdir())
    env = _env(SQLTool(db, vm_steps=FUZZ_VM_STEPS), max_query_chars=2_000_000)
    rng = random.Random(1234)
    counts: dict[str, int] = {}
    worst, wall = 0.0, []
    record = _record(splits)
    for i in range(FUZZ_QUERIES):
        category, query = _fuzz_query(rng, str(tmp_path))
        counts[category] = counts.get(category, 0) + 1
        # Sometimes not even a well-formed call: the raw text, or a call cut short.
        text = format_call("sql", {"query": query}) if i % 50 else f'<tool_call>{{"name": "sql", "arguments": {{"query": {query!r}'
        state = env.reset(record)
        start, cpu_start = time.monotonic(), time.thread_time()
        result = env.step_batch([state], [text])[0]
        worst = max(worst, time.thread_time() - cpu_start)
        wall.append(time.monotonic() - start)
        assert isinstance(result.observation, str) and result.observation
        if category in _REFUSED:
            assert result.info["bad_call"] == 1.0, (category, query[:200], result.observation)
    # A batch of many at once goes through the same path.
    states = [env.reset(record) for _ in range(64)]
    texts = [format_call("sql", {"query": _fuzz_query(rng, str(tmp_path))[1]}) for _ in range(64)]
    assert len(env.step_batch(states, texts)) == 64
    assert sum(counts.values()) >= FUZZ_QUERIES and counts["forever"] > 100 and counts["huge"] > 20
    assert _sha(db) == before
    assert sorted(p.name for p in data.iterdir()) == files_before and not list(tmp_path.iterdir())
    wall.sort()
    print(json.dumps({"queries": sum(counts.values()) + 64, "by_category": counts, "worst_step_cpu_s": round(worst, 4),
                      "wall_s": {"p50": round(wall[len(wall) // 2], 4), "p99": round(wall[int(len(wall) * 0.99)], 4),
                                 "max": round(wall[-1], 4)},
                      "load_average": os.getloadavg()}))
