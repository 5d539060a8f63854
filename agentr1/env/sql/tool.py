"""The ``sql`` tool: one read-only SQLite query per call over the dataset's database.

The model writes SQL; SQL written by a model is hostile input. The defences, each enough for
what it covers, none trusted alone:

- the file is opened read-only (URI ``mode=ro``) with ``PRAGMA query_only`` on;
- an authorizer allows only reading: ``SQLITE_SELECT``, ``SQLITE_READ``, ``SQLITE_RECURSIVE``
  (a recursive CTE is a read; the VM-step budget bounds it) and ``SQLITE_FUNCTION`` for the
  functions of :data:`ALLOWED_FUNCTIONS`. Everything else is denied at prepare time: writes,
  DDL (temp tables and views included), ``ATTACH`` (which ``VACUUM INTO`` needs too),
  ``PRAGMA``, transactions, ``load_extension`` and any function not on the list;
- a progress handler aborts a query once it has run :data:`VM_STEPS` virtual-machine
  instructions (counted every :data:`PROGRESS_OPS`): a budget of work, not of time, so whether a
  query finishes never depends on how busy the machine is. It binds before the sandbox's time
  limits only because no step can be made expensive: one instruction can call a function whose
  cost grows with its arguments (``instr``/``replace`` over two long strings is quadratic), so
  :data:`MAX_VALUE_BYTES` keeps every value, and the statement itself, small enough that
  :data:`VM_STEPS` of the dearest steps stay well inside ``sandbox.cpu_s``, and inside
  ``sandbox.wall_s`` beside 4 busy processes;
- temporary tables and sorts stay in memory (``temp_store = MEMORY``: no temp files), and inside
  a sandbox worker (``agentr1.env.sandbox``, where every tool call runs) SQLite's whole heap is
  capped at :data:`HEAP_LIMIT_BYTES`, which bounds what the VM-step count cannot see: planning.
  A planner bomb (nested CTEs that blow up before the first instruction runs) fails there with
  "out of memory" in well under a second, and the worker's own memory and time limits stand
  behind it;
- SQLite's own limits cap one string or blob (:data:`MAX_VALUE_BYTES`, so no single instruction
  can build a gigabyte), the columns of a result, the statement's length (:data:`MAX_SQL_BYTES`,
  whatever ``env.max_query_chars`` allows) and its expression depth and compound terms;
- at most ``max_rows`` rows are fetched and the text is cut to ``max_chars``; the observation
  says so when it cuts.

A query that fails (syntax, a denied action, its budget, a bad value) raises
:class:`~agentr1.env.tools.ToolError` with SQLite's message, which the environment shows as the
observation and charges as a bad call. A good query's output text is a header line of column
names then one line per row, cells joined by `` | ``, every name and cell on one line (its
whitespace collapsed), so no value can fake a row; its ``keys`` are the shown cells' values
as strings, which the environment matches against a record's gold-chain values
(``meta["gold_values"]``) for the process reward.
"""
from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from agentr1.env.tools import ToolError, ToolOutput

SQL_TOOL_NAME = "sql"
DB_FILE = "world.sqlite"
"""The database file of a dataset directory (next to ``corpus.jsonl``)."""
MAX_ROWS = 10
MAX_CHARS = 1000
"""The observation's length when the environment sets no ``max_doc_chars``."""
VM_STEPS = 2_000_000
"""Virtual-machine instructions per query. The generated questions' queries are primary-key
look-ups of a few hundred instructions; an analytic query over the SQL world (a GROUP BY over
people's 72k rows) takes 1.2M. The dearest steps measured here (``instr`` of a 500-character
needle in a 1,000-character string, as many calls per row as a statement of
:data:`MAX_VALUE_BYTES` holds) cost ~0.35 us, so the whole budget is ~0.7 s of CPU: the budget
ends such a query, idle or beside 4 busy processes, never the sandbox's 5 s CPU or 10 s wall
limit (it was 10M steps with 100 KB values: ~40 us a step, 400 s of work)."""
PROGRESS_OPS = 1000
"""Instructions between two calls of the progress handler (its Python callback costs well under
1% of a query)."""
HEAP_LIMIT_BYTES = 64 << 20
"""SQLite's memory in a sandbox worker (``PRAGMA hard_heap_limit``, which binds every SQLite
connection of a process: it is set only there, never in the trainer, where MLflow's store uses
SQLite too)."""
MAX_VALUE_BYTES = 1024
"""SQLITE_LIMIT_LENGTH: the longest string or blob a query may build, a row of a temporary
table, and the statement's text (default 1 GB). The world's values are names of at most 9
characters, and an observation shows 1,000 characters at most: nothing a query needs is
longer, and the cap bounds what one step can cost (:data:`VM_STEPS`)."""
MAX_COLUMNS = 64
MAX_SQL_BYTES = 10_000
"""SQLITE_LIMIT_SQL_LENGTH: the longest statement, whatever ``env.max_query_chars`` lets through."""
MAX_EXPR_DEPTH = 64
MAX_COMPOUND_SELECT = 16
MAX_CELL_CHARS = 200
"""One cell as shown; a longer value is cut (the row and character limits still apply)."""
CELL_SEP = " | "
NULL_TEXT = "NULL"

ALLOWED_FUNCTIONS = frozenset({
    # scalar
    "abs", "coalesce", "ifnull", "iif", "instr", "length", "like", "glob", "lower", "upper", "ltrim",
    "rtrim", "trim", "nullif", "replace", "round", "substr", "substring", "typeof", "hex", "quote",
    "unicode", "char", "min", "max",
    # aggregate
    "count", "sum", "total", "avg", "group_concat",
})
"""Functions a query may call: the reading and string functions. Left out on purpose:
``load_extension``, ``randomblob``/``zeroblob`` (cheap giant values), ``printf``/``format``
(width arguments), ``random`` (results must be reproducible) and whatever an extension adds."""
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, getattr(sqlite3, "SQLITE_RECURSIVE", 33)})


def _authorize(action: int, arg1, arg2, db_name, trigger) -> int:
    """SQLite's authorizer callback: reads only (module docstring)."""
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and isinstance(arg2, str) and arg2.lower() in ALLOWED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _text(value: bytes) -> str:
    # Stored text need not be valid UTF-8 (CAST(x'ff' AS TEXT)); show it, never fail on it.
    return value.decode("utf-8", "replace")


def open_read_only(path: str | Path) -> sqlite3.Connection:
    """A connection to ``path`` that can only read (module docstring); FileNotFoundError when
    there is no such file (SQLite would create nothing in read-only mode, but say it plainly)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the SQL tool's database is missing")
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA query_only = 1")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.text_factory = _text
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, MAX_EXPR_DEPTH)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, MAX_COMPOUND_SELECT)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorize)  # last: the set-up above is the only unchecked SQL ever run
    return conn


def format_rows(columns: list[str], rows: list[tuple], more: bool, max_rows: int, max_chars: int) -> tuple[str, list[str]]:
    """The observation text and the shown cells' values (``keys``); a note says what was cut."""
    lines = [CELL_SEP.join(_cell(c) for c in columns)[:max_chars]]  # a wide join's header is cut too
    keys: list[str] = []
    used = len(lines[0])
    shown = 0
    for row in rows:
        cells = [_cell(v) for v in row]
        line = CELL_SEP.join(cells)
        if used + 1 + len(line) > max_chars:
            break
        lines.append(line)
        keys += [c for c, v in zip(cells, row) if v is not None]
        used += 1 + len(line)
        shown += 1
    if not rows:
        lines.append("(no rows)")
    elif shown < len(rows) or more:
        lines.append(f"(cut: the first {shown} rows shown; at most {max_rows} rows and {max_chars} characters are)")
    return "\n".join(lines), keys


def _cell(value) -> str:
    if value is None:
        return NULL_TEXT
    if isinstance(value, bytes):
        text = "x'" + value[: MAX_CELL_CHARS // 2].hex() + "'"
    else:
        text = str(value)
    text = " ".join(text.split())  # one row per line, whatever the value holds
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "..."


class SQLTool:
    """The ``sql`` tool the agent calls (module docstring)."""

    name = SQL_TOOL_NAME

    def __init__(self, db_path: str | Path, max_rows: int = MAX_ROWS, max_chars: int | None = MAX_CHARS,
                 vm_steps: int = VM_STEPS):
        self.db_path = Path(db_path)
        self.max_rows, self.max_chars, self.vm_steps = max_rows, max_chars or MAX_CHARS, vm_steps
        self._ticks = 0
        self._open()

    def _open(self) -> None:
        self.conn = open_read_only(self.db_path)
        self.conn.set_progress_handler(self._over_budget, PROGRESS_OPS)

    def _over_budget(self) -> int:
        self._ticks += 1
        return int(self._ticks * PROGRESS_OPS > self.vm_steps)  # nonzero aborts the query ("interrupted")

    def enter_sandbox(self) -> None:
        """Called by the sandbox worker before the first query: cap SQLite's heap (module
        docstring) and open a connection of its own (the worker closed what it inherited)."""
        with contextlib.closing(sqlite3.connect(":memory:")) as conn:  # this one's authorizer denies PRAGMA
            conn.execute(f"PRAGMA hard_heap_limit = {HEAP_LIMIT_BYTES}")
        self._open()

    def __call__(self, query: str):
        """Run one read-only SQL query (SQLite) on the database and return its rows.

        Args:
            query: One SELECT statement, e.g. SELECT director FROM films WHERE title = 'Bazolun'
        """
        self._ticks = 0
        try:
            cursor = self.conn.execute(query)
            rows = cursor.fetchmany(self.max_rows + 1)
            columns = [d[0] for d in cursor.description or ()]
            cursor.close()
        except sqlite3.OperationalError as err:
            if str(err) == "interrupted":
                raise ToolError(f"the query ran more than {self.vm_steps:,} steps and was stopped") from None
            raise ToolError(f"SQL error: {_message(err)}") from None
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as err:
            # Several statements (Warning), a NUL or a lone surrogate in the text (ValueError/
            # UnicodeEncodeError), an integer SQLite cannot hold: the model's query, its error.
            raise ToolError(f"SQL error: {_message(err)}") from None
        if not columns:
            raise ToolError("SQL error: not a query (only SELECT statements return rows)")
        text, keys = format_rows(columns, rows[: self.max_rows], len(rows) > self.max_rows,
                                 self.max_rows, self.max_chars)
        return ToolOutput(text, tuple(keys))

    def close(self) -> None:
        self.conn.close()


def _message(err: Exception) -> str:
    """SQLite's message, or its error name where the message is empty (out of memory is)."""
    if isinstance(err, MemoryError) or getattr(err, "sqlite_errorname", None) == "SQLITE_NOMEM":
        return "out of memory (the query needs more than SQLite's heap limit to plan or run)"
    return str(err) or getattr(err, "sqlite_errorname", None) or type(err).__name__


def sql_tool(cfg, data_dir: Path) -> SQLTool:
    """The registered tool factory: the ``sql`` tool over the database of ``data_dir`` (the dataset,
    or a served model's resources: ``registry.build_tools`` always hands a factory a directory)."""
    return SQLTool(Path(data_dir) / DB_FILE, max_chars=cfg.env.max_doc_chars)

