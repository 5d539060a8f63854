"""The units MCP server (``UNITS_SERVER``: docs/examples/units_mcp_server.py), which exits once, at its Nth call
(``CRASH_AT``), unless the file ``CRASH_MARKER`` says it already did: the server crash a run
must survive (tests/test_mcp.py). Not a test module: the tests start it as a process."""
from __future__ import annotations

import os
import runpy
import threading
from pathlib import Path

from mcp.server.mcpserver import MCPServer

example = runpy.run_path(os.environ["UNITS_SERVER"])  # by an absolute path: a logged model carries this file only
server = MCPServer("units-flaky")
calls = 0
counting = threading.Lock()  # the SDK may run concurrent calls of a sync tool in worker threads


@server.tool()
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length from one unit to another (units: km, m, cm, mm, mi, yd, ft)."""
    global calls
    with counting:
        calls += 1
        call = calls
        marker = Path(os.environ["CRASH_MARKER"])
        if call == int(os.environ["CRASH_AT"]) and not marker.exists():
            marker.write_text(f"crashed at call {call}\n")
            os._exit(1)
    return example["convert"](value, from_unit, to_unit)


if __name__ == "__main__":
    server.run()
