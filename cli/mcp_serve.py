"""``agentr1 mcp-serve``: an environment's tools as an MCP server, for any MCP client.

    agentr1 mcp-serve --data data                     (the search tool over data/corpus.jsonl, stdio)
    agentr1 mcp-serve --config conf/sql.yaml --data data-sql --http 8765   (the sql tool, streamable HTTP)

It serves the tools the agent of ``--config`` has (the environment's own, ``env.tools``,
plug-ins', MCP servers') over the dataset ``--data``, through the official ``mcp`` SDK's
low-level server: ``tools/list`` gives each tool's JSON schema (the one the agent sees), and
``tools/call`` checks the arguments against it (a bad call is an ``isError`` result naming the
field, never an exception) and runs the tool as an episode would, in its sandbox worker. A
result's ``structuredContent`` carries ``{"keys": [...]}`` (the document ids or values the
process reward matches), so this project's own MCP adapter (``agentr1.env.mcp``) trains on these
tools as on local ones. Over stdio, stdout carries the protocol alone; logs go to stderr.
"""
from __future__ import annotations

import argparse

from agentr1.errors import EXIT_OK


def tool_server(env, name: str = "agentr1"):
    """The SDK's low-level ``Server`` answering ``tools/list`` and ``tools/call`` with ``env``'s tools."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from agentr1.env.protocol import argument_problem

    schemas = {s["function"]["name"]: s["function"] for s in env.tools}
    listed = [types.Tool(name=n, description=f.get("description") or n, input_schema=f["parameters"])
              for n, f in schemas.items()]
    limit = env.settings.max_query_chars

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        def result(text: str, error: bool, keys: tuple[str, ...] = ()) -> types.CallToolResult:
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=error,
                                        structured_content=None if error else {"keys": list(keys)})

        if params.name not in schemas:
            return result(f"no tool {params.name!r}; tools: {', '.join(schemas)}", True)
        arguments = params.arguments or {}
        problem = argument_problem(arguments, schemas[params.name]["parameters"], limit)
        if problem:
            return result(f"bad call: {problem}", True)
        # The tool (its sandbox worker) blocks: off the event loop, one call of a tool at a time.
        (output, failed), = await anyio.to_thread.run_sync(env.tool(params.name).run_batch, [arguments])
        return result(output.text, failed, output.keys)

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    import anyio

    from agentr1.config import load_config
    from agentr1.env.registry import build_env, resolve
    from cli.console import quiet_third_party, setup_logging, stdout_to_stderr

    setup_logging()
    quiet_third_party()
    overrides = [*([f"data.dir={args.data}"] if args.data else []), *args.override]
    with stdout_to_stderr():  # building the tools (an index) may print; over stdio, stdout is the protocol's
        cfg = resolve(load_config(args.config, overrides))
        env = build_env(cfg, cfg.data.dir)
    server = tool_server(env)
    names = ", ".join(s["function"]["name"] for s in env.tools)
    if args.http is None:
        import sys

        from mcp.server.stdio import stdio_server

        print(f"agentr1: MCP server over stdio with tools {names}", file=sys.stderr, flush=True)

        async def run_stdio() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run_stdio)
        return EXIT_OK
    import uvicorn

    print(f"agentr1: MCP server at http://{args.host}:{args.http}/mcp (streamable HTTP) with tools {names}",
          flush=True)
    uvicorn.run(server.streamable_http_app(host=args.host), host=args.host, port=args.http, log_level="warning")
    return EXIT_OK


def add_mcp_serve(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("mcp-serve", help="serve an environment's tools (search, sql, plug-ins') as an MCP server")
    p.add_argument("--config", default="conf/train.yaml", help="whose agent's tools (default: conf/train.yaml)")
    p.add_argument("--data", default=None, help="the dataset the tools read (default: the config's data.dir)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--http", type=int, default=None, metavar="PORT",
                   help="serve streamable HTTP on this port (default: stdio)")
    p.add_argument("--host", default="127.0.0.1", help="with --http: the address to listen on")
    p.set_defaults(func=cmd_mcp_serve)
