"""The length-unit converter of docs/examples/units.py, as an MCP server (the `mcp` SDK's MCPServer).

Nothing here imports agentr1: this is any MCP server a user already has. An agent is trained on
its tool by naming it in the config (`conf/units-mcp.yaml`):

    env:
      kind: tools
      mcp: [{name: units, command: [python, docs/examples/units_mcp_server.py]}]

Run it alone with `python docs/examples/units_mcp_server.py` (stdio) or
`python docs/examples/units_mcp_server.py --http 8765` (streamable HTTP at
http://127.0.0.1:8765/mcp).
"""
from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

METRES = {"km": 1000.0, "m": 1.0, "cm": 0.01, "mm": 0.001, "mi": 1609.344, "yd": 0.9144, "ft": 0.3048}

server = MCPServer("units")


@server.tool()
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length from one unit to another (units: km, m, cm, mm, mi, yd, ft)."""
    if from_unit not in METRES or to_unit not in METRES:
        raise ToolError(f"unknown unit; known: {', '.join(METRES)}")  # the agent reads this (isError)
    if abs(value) > 1e12:
        raise ToolError("value too large")
    return f"{value * METRES[from_unit] / METRES[to_unit]:.4g} {to_unit}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
