"""The ``sql`` tool: one read-only SQLite query per call over the dataset's database.

The model writes SQL; SQL written by a model is hostile input. The defences, each enough for
what it covers, none trusted alone:

- the file is opened read-only (URI ``mode=ro``) with ``PRAGMA query_only`` on;
- an authorizer allows only reading: ``SQLITE_SELECT``, ``SQLITE_READ``, ``SQLITE_RECURSIVE``
  (a recursive CTE is a read; the time limit bounds it) and ``SQLITE_FUNCTION`` for the
  functions of :data:`ALLOWED_FUNCTIONS`. Everything else is denied at prepare time: writes,
  DDL (temp tables and views included), ``ATTACH`` (which ``VACUUM INTO`` needs too),
  ``PRAGMA``, transactions, ``load_extension`` and any function not on the list;
- a progress handler aborts a query once it has run :attr:`SQLTool.time_limit_s` (checked
  every :data:`PROGRESS_OPS` virtual-machine instructions, microseconds apart);
- SQLite's own limits cap one string or blob (:data:`MAX_VALUE_BYTES`, so no single instruction
  can build a gigabyte), the columns of a result and the statement's length;
- at most ``max_rows`` rows are fetched and the text is cut to ``max_chars``; the observation
  says so when it cuts.

A query that fails (syntax, a denied action, the time limit, a bad value) raises
:class:`~agentr1.env.tools.ToolError` with SQLite's message, which the environment shows as the
observation and charges as a bad call. A good query's output text is a header line of column
names then one line per row, cells joined by `` | ``; its ``keys`` are the shown cells' values
as strings, which the environment matches against a record's gold-chain values
(``meta["gold_values"]``) for the process reward.
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from agentr1.env.tools import ToolError, ToolOutput

SQL_TOOL_NAME = "sql"
DB_FILE = "world.sqlite"
"""The database file of a dataset directory (next to ``corpus.jsonl``)."""
MAX_ROWS = 10
MAX_CHARS = 1000
"""The observation's length when the environment sets no ``max_doc_chars``."""
TIME_LIMIT_S = 0.5
"""Per query. The generated questions' queries are primary-key look-ups (well under 1 ms)."""
PROGRESS_OPS = 1000
"""Instructions between two looks at the clock: ~10-100 us apart, so a query stops within a
millisecond or so of its limit, and the Python callback costs well under 1% of a query."""
MAX_VALUE_BYTES = 100_000
"""SQLITE_LIMIT_LENGTH: the longest string or blob a query may build (default 1 GB)."""
MAX_COLUMNS = 64
MAX_SQL_BYTES = 100_000
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
    conn.text_factory = _text
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorize)  # last: the set-up above is the only unchecked SQL ever run
    return conn


def format_rows(columns: list[str], rows: list[tuple], more: bool, max_rows: int, max_chars: int) -> tuple[str, list[str]]:
    """The observation text and the shown cells' values (``keys``); a note says what was cut."""
    lines = [CELL_SEP.join(columns)]
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
                 time_limit_s: float = TIME_LIMIT_S):
        self.db_path = Path(db_path)
        self.max_rows, self.max_chars, self.time_limit_s = max_rows, max_chars or MAX_CHARS, time_limit_s
        self.conn = open_read_only(db_path)
        self._deadline = 0.0
        self.conn.set_progress_handler(self._past_deadline, PROGRESS_OPS)

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self._deadline)  # nonzero aborts the query ("interrupted")

    def __call__(self, query: str):
        """Run one read-only SQL query (SQLite) on the database and return its rows.

        Args:
            query: One SELECT statement, e.g. SELECT director FROM films WHERE title = 'Bazolun'
        """
        self._deadline = time.monotonic() + self.time_limit_s
        try:
            cursor = self.conn.execute(query)
            rows = cursor.fetchmany(self.max_rows + 1)
            columns = [d[0] for d in cursor.description or ()]
            cursor.close()
        except sqlite3.OperationalError as err:
            if str(err) == "interrupted":
                raise ToolError(f"the query ran longer than {self.time_limit_s:g} s and was stopped") from None
            raise ToolError(f"SQL error: {err}") from None
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as err:
            # Several statements (Warning), a NUL or a lone surrogate in the text (ValueError/
            # UnicodeEncodeError), an integer SQLite cannot hold: the model's query, its error.
            raise ToolError(f"SQL error: {err}") from None
        if not columns:
            raise ToolError("SQL error: not a query (only SELECT statements return rows)")
        text, keys = format_rows(columns, rows[: self.max_rows], len(rows) > self.max_rows,
                                 self.max_rows, self.max_chars)
        return ToolOutput(text, tuple(keys))

    def close(self) -> None:
        self.conn.close()


def db_path_of(data_dir: str | Path) -> Path:
    """The database of a dataset directory, or of the directory holding ``data_dir`` when it is a
    file (a served agent's resources: its logged corpus file, the database beside it)."""
    data_dir = Path(data_dir)
    return (data_dir if data_dir.is_dir() else data_dir.parent) / DB_FILE


def sql_tool(cfg, data_dir: Path) -> SQLTool:
    """The registered tool factory: the ``sql`` tool over ``data_dir``'s database."""
    return SQLTool(db_path_of(data_dir), max_chars=cfg.env.max_doc_chars)

