"""MCP servers as tools: ``env.mcp`` in the config hands the agent every tool an MCP server lists.

The Model Context Protocol is how the ecosystem hands an agent tools (``tools/list``,
``tools/call``). A server named in the config is started with the run (a stdio command) or
reached over streamable HTTP (a URL), through the official ``mcp`` SDK; each tool it lists
becomes a :class:`McpTool`, the same typed tool a Python function makes: its ``inputSchema`` is
the schema the model sees and the turn parser checks arguments against (a wrong type, a missing
or an extra argument is a bad call that never reaches the server), its output is the
observation, and a call that fails is an error observation with the bad-call penalty::

    env:
      kind: tools
      mcp:
        - {name: units, command: [python, docs/examples/units_mcp_server.py]}
        - {name: shop, url: "http://127.0.0.1:8765/mcp", tools: [lookup_price]}

What a call gives the agent: the text of the result's content (other content types as a
placeholder), cut to ``env.sandbox.output_chars``; a result the server marks ``isError`` is a
failed call. A result whose ``structuredContent`` has ``"keys": [...]`` (strings) feeds the
process reward as a Python tool's ``ToolOutput.keys`` do.

Bounds and faults (the server process is the sandbox: it runs apart from the trainer, and the
trainer bounds what it waits for and what it reads):

- one turn's calls to a server go out together; each may take ``env.sandbox.wall_s`` seconds,
  after which it is a failed call ("took longer than ...") and the SDK cancels it;
- a server that dies (or whose connection breaks) fails the calls in flight as error
  observations; the next call starts it again (a warning in the log); one that cannot be
  started again fails the run with :class:`McpError` (exit 2) naming the server and the last
  lines of its stderr;
- a stdio server runs in its own process group and stops with the run (its stdin closes, then
  SIGTERM, then SIGKILL); its stderr goes to a temporary file, not the console.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from agentr1.env.protocol import encodable, excerpt
from agentr1.env.tools import Tool, ToolDefinitionError, ToolError, ToolOutput, valid_tool_name
from agentr1.errors import UserError

log = logging.getLogger(__name__)

CALL_SLACK_S = 5.0
"""Seconds beyond ``wall_s`` the trainer waits for a turn's calls before it gives up on them."""
STOP_S = 10.0
"""Seconds a server's connection may take to close (the SDK's own stop escalation within)."""
STDERR_TAIL_CHARS = 1500
MAX_KEYS = 100


class McpError(UserError, RuntimeError):
    """An MCP server that cannot be started, cannot list the tools asked for, or cannot be
    started again after it died; the message names the server and shows its stderr's end."""


def _clean_schema(schema: Any) -> Any:
    """An MCP ``inputSchema`` in the subset the turn parser reads: pydantic's ``title`` keys go,
    and ``anyOf`` of plain types (an optional argument) becomes a list of types."""
    if isinstance(schema, list):
        return [_clean_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):  # argument names, not schema keywords
            out[key] = {name: _clean_schema(v) for name, v in value.items()}
        elif key != "title":
            out[key] = _clean_schema(value)
    variants = out.get("anyOf")
    if isinstance(variants, list) and variants and all(isinstance(v, dict) and set(v) == {"type"} for v in variants):
        out.pop("anyOf")
        out["type"] = [v["type"] for v in variants]
    elif isinstance(variants, list) and {"type": "null"} in variants:
        typed = [v for v in variants if v != {"type": "null"}]
        if len(typed) == 1 and isinstance(typed[0], dict):  # Optional[X] of a structured X
            out.pop("anyOf")
            out = {**typed[0], **out, "nullable": True}
    return out


_UNCHECKED = ("$ref", "anyOf", "oneOf", "allOf", "not")


def _schema_problem(schema: Any) -> str | None:
    """Why the turn parser cannot check arguments against ``schema`` (one property's), or None."""
    if not isinstance(schema, dict):
        return f"its schema is {excerpt(repr(schema), 60)}, not a JSON object"
    words = [k for k in _UNCHECKED if k in schema]
    if words:
        return f"its schema uses {words[0]}, which the turn parser does not read (give it plain JSON types)"
    for inner in (schema.get("items"), *(schema.get("properties") or {}).values()):
        problem = None if inner is None else _schema_problem(inner)
        if problem:
            return problem
    return None


def tool_schema(server: str, listed: Any) -> dict:
    """The ``{"type": "function", ...}`` schema of a tool a server listed (``mcp`` ``Tool``)."""
    name = listed.name
    if not valid_tool_name(name):
        raise ToolDefinitionError(f"env.mcp {server!r}: tool name {name!r} must be letters, digits, _ or - "
                                  "(the agent's call format names tools so)")
    parameters = _clean_schema(dict(listed.input_schema or {})) or {}
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    parameters["additionalProperties"] = False  # the parser refuses what the schema does not name
    for field, spec in parameters["properties"].items():
        problem = _schema_problem(spec)
        if problem:  # the agent could never make a call the server takes
            raise ToolDefinitionError(f"env.mcp {server!r}: tool {name!r}, argument {excerpt(str(field), 60)!r}: "
                                      f"{problem}; leave the tool out with the server's `tools:` list")
    description = (listed.description or name).strip()
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _output(name: str, result: Any, output_chars: int) -> tuple[ToolOutput, bool]:
    parts = [getattr(c, "text", None) if getattr(c, "type", None) == "text" else f"[{getattr(c, 'type', '?')} content]"
             for c in getattr(result, "content", None) or []]
    text = encodable("\n".join(p for p in parts if p is not None))[:output_chars]
    if getattr(result, "is_error", False):
        return ToolOutput(f"Error: tool '{name}' failed: {excerpt(text, 120)}"), True
    structured = getattr(result, "structured_content", None)
    keys = structured.get("keys") if isinstance(structured, dict) else None
    keys = tuple(encodable(str(k)) for k in keys[:MAX_KEYS]) if isinstance(keys, list) else ()
    return ToolOutput(text, keys), False


class _Connection:
    """One session with a server: an asyncio loop in a daemon thread holds the SDK's transport
    and ``ClientSession`` open (both must be entered and left in one task) until :meth:`close`."""

    def __init__(self, spec: Any, cwd: Path | None, errlog):
        self.spec, self.cwd, self.errlog = spec, cwd, errlog
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"agentr1-mcp-{spec.name}", daemon=True)
        self.session = None
        self.stop: asyncio.Event | None = None
        self.held: concurrent.futures.Future | None = None
        self.broken = False

    def open(self) -> list:
        """Start (or reach) the server and list its tools."""
        self.thread.start()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self.held = asyncio.run_coroutine_threadsafe(self._hold(ready), self.loop)
        return ready.result(timeout=self.spec.start_timeout_s)

    def _transport(self):
        if self.spec.url:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.spec.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        command, *args = self.spec.command
        params = StdioServerParameters(command=sys.executable if command == "python" else command, args=args,
                                       env=dict(self.spec.env) or None, cwd=self.cwd)
        return stdio_client(params, errlog=self.errlog)

    async def _hold(self, ready: concurrent.futures.Future) -> None:
        from mcp import ClientSession
        from mcp_types import PaginatedRequestParams

        self.stop = asyncio.Event()
        try:
            async with self._transport() as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                listed, cursor = [], None
                while True:
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    listed += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.session = session
                ready.set_result(listed)
                await self.stop.wait()
        except BaseException as err:  # noqa: BLE001 - the opener reads it from ``ready``
            if not ready.done():
                ready.set_exception(err)
        finally:
            self.session = None

    def call(self, name: str, calls: list[dict], wall_s: float, output_chars: int) -> list[tuple[ToolOutput, bool]]:
        future = asyncio.run_coroutine_threadsafe(self._calls(name, calls, wall_s, output_chars), self.loop)
        try:
            return future.result(wall_s + CALL_SLACK_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self.broken = True
            return [(ToolOutput(f"Error: tool '{name}' failed: its MCP server did not answer in {wall_s:g} s"),
                     True)] * len(calls)

    async def _calls(self, name: str, calls: list[dict], wall_s: float, output_chars: int):
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        session = self.session
        if session is None:
            self.broken = True
            return [(ToolOutput(f"Error: tool '{name}' failed: its MCP server is not running"), True)] * len(calls)
        results = await asyncio.gather(*(session.call_tool(name, args, read_timeout_seconds=wall_s) for args in calls),
                                       return_exceptions=True)
        out = []
        for result in results:
            if not isinstance(result, BaseException):
                out.append(_output(name, result, output_chars))
                continue
            code = result.error.code if isinstance(result, MCPError) else None
            if code == REQUEST_TIMEOUT:
                why = f"took longer than {wall_s:g} s"
            elif isinstance(result, MCPError) and code != CONNECTION_CLOSED:
                why = excerpt(result.error.message, 120)  # the server refused the call: its words
            elif isinstance(result, MCPError):
                self.broken = True
                why = "its MCP server stopped answering"
            else:  # failed on this side (arguments that would not serialise...): the ping below decides
                why = f"the call could not be made ({type(result).__name__})"
            out.append((ToolOutput(f"Error: tool '{name}' failed: {why}"), True))
        if not self.broken and any(isinstance(r, BaseException) for r in results):  # a timeout: still there?
            self.broken = not await self._alive()
        return out

    async def _alive(self) -> bool:
        try:
            await asyncio.wait_for(self.session.send_ping(), timeout=5)
            return True
        except Exception:  # noqa: BLE001 - any failure means the session is gone
            return False

    def close(self) -> None:
        if self.stop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.stop.set)
        if self.held is not None:
            try:
                self.held.result(timeout=STOP_S)
            except Exception:  # noqa: BLE001 - a connection that fails to close is abandoned
                pass
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread.is_alive():
            self.thread.join(STOP_S)


def _close(holder: list) -> None:
    for conn in holder:
        conn.close()
    holder.clear()


class McpServer:
    """A server named in ``env.mcp``: its connection, started again when it breaks."""

    def __init__(self, spec: Any, wall_s: float, output_chars: int, cwd: Path | None = None):
        self.spec, self.wall_s, self.output_chars = spec, wall_s, output_chars
        self.cwd = Path(cwd or Path.cwd()).resolve()
        self.errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self._holder: list[_Connection] = []  # what the finalizer closes: never this object itself
        self._lock = threading.Lock()
        self.starts = 0
        weakref.finalize(self, _close, self._holder)

    def start(self) -> list:
        """Connect and list the tools (``mcp`` ``Tool`` objects); McpError when it cannot."""
        conn = _Connection(self.spec, self.cwd, self.errlog)
        self._holder.append(conn)
        self.starts += 1
        where = f"url {self.spec.url}" if self.spec.url else f"command {' '.join(self.spec.command)!r} in {self.cwd}"
        try:
            return conn.open()
        except concurrent.futures.TimeoutError:
            problem = f"no answer in {self.spec.start_timeout_s:g} s (env.mcp start_timeout_s)"
        except Exception as err:  # noqa: BLE001 - said below, with the server's stderr
            problem = f"{type(err).__name__}: {_reason(err)}"
        _close(self._holder)
        raise McpError(f"env.mcp {self.spec.name!r} ({where}) did not start: {problem}{self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        try:
            self.errlog.flush()
            self.errlog.seek(0)
            tail = self.errlog.read()[-STDERR_TAIL_CHARS:].strip()
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends:\n{tail}" if tail else ""

    def call(self, name: str, calls: list[dict]) -> list[tuple[ToolOutput, bool]]:
        """One turn's calls of tool ``name`` (validated arguments), each answer and whether it failed."""
        with self._lock:
            if not self._holder or self._holder[-1].broken:
                self._restart()
            return self._holder[-1].call(name, calls, self.wall_s, self.output_chars)

    def _restart(self) -> None:
        log.warning("MCP server %r stopped answering; starting it again (start %d)", self.spec.name, self.starts + 1)
        _close(self._holder)
        self.start()

    def close(self) -> None:
        """Stop the server now (it stops with this process anyway)."""
        with self._lock:
            _close(self._holder)


def _reason(err: BaseException) -> str:
    """The innermost message of an exception group (anyio's task groups wrap the real cause)."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return excerpt(f"{err}" or type(err).__name__, 300)


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool an MCP server lists; its calls go to the server (``tools/call``)."""

    server: McpServer | None = None
    isolated: ClassVar[bool] = True  # it runs in the server's process: no sandbox worker around it

    def run_batch(self, calls: list[dict]) -> list[tuple[ToolOutput, bool]]:
        return self.server.call(self.name, calls) if calls else []


def _call_one(server: McpServer, name: str, **arguments: Any) -> ToolOutput:
    """A single call as a plain function (``Tool.fn``): the output, or ToolError for a failed one."""
    (output, failed), = server.call(name, [arguments])
    if failed:
        raise ToolError(output.text)
    return output


def command_files(specs: list[Any], cwd: Path | None = None) -> dict[tuple[int, int], Path]:
    """``{(server index, argument index): file}`` for each argument of a stdio server's command
    that names an existing file (its script): what a logged model carries so that the served
    agent starts the same server (``adapters/agent_model.py`` points the arguments at the copies)."""
    base = Path(cwd or Path.cwd())
    return {(i, j): (base / arg).resolve() for i, spec in enumerate(specs) for j, arg in enumerate(spec.command)
            if j > 0 and (base / arg).is_file()}


def mcp_tools(cfg: Any, cwd: Path | None = None) -> list[Tool]:
    """The tools of every server in ``cfg.env.mcp``, each server started (McpError when one does
    not start or lacks a tool its ``tools`` names)."""
    from functools import partial

    sandbox = cfg.env.sandbox
    tools: list[Tool] = []
    for spec in cfg.env.mcp:
        server = McpServer(spec, sandbox.wall_s, sandbox.output_chars, cwd)
        listed = {t.name: t for t in server.start()}
        wanted = list(listed) if spec.tools is None else spec.tools
        missing = [n for n in wanted if n not in listed]
        if missing:
            server.close()
            raise McpError(f"env.mcp {spec.name!r}: the server lists no tool {missing[0]!r}; it lists "
                           f"{', '.join(listed) or 'none'}")
        try:
            schemas = {name: tool_schema(spec.name, listed[name]) for name in wanted}
        except ToolDefinitionError:
            server.close()
            raise
        tools += [McpTool(name, schemas[name], partial(_call_one, server, name), server=server) for name in wanted]
    return tools
