"""MCP both ways: a real MCP server's tools (the SDK's MCPServer, started as a process) become the
agent's typed tools, survive the server's crash, and train end to end; and `agentr1 mcp-serve`
answers the SDK's own client."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_agent_model import _free_port
from test_faults_registry import empty_db, fresh_store  # noqa: F401  (fixtures: a store of this test's own)
from test_trainer import TINY, data_dir  # noqa: F401  (fixture)

from agentr1.config import Config, load_config
from agentr1.env.base import ToolEnv
from agentr1.env.mcp import McpError, McpTool, command_files, mcp_tools
from agentr1.env.registry import build_env
from agentr1.env.tools import ToolOutput
from agentr1.presets import DataSource
from flows.forms import PipelineParams

ROOT = Path(__file__).resolve().parents[1]
SERVER = "docs/examples/units_mcp_server.py"
FLAKY = "tests/mcp_flaky_units.py"


def units_cfg(*servers: dict, **env) -> Config:
    return Config.model_validate({"env": {"kind": "tools", "mcp": list(servers), **env}})


def server_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if any(s in " ".join(p.cmdline()) for s in
                                                                        ("units_mcp_server", "mcp_flaky_units"))]


def test_an_mcp_servers_tool_is_a_typed_tool_and_a_crash_costs_one_call(caplog):
    """The schema comes from tools/list; the parser refuses a bad call before the server sees it;
    the server's isError result is a failed call; a killed server fails the call in flight, then
    starts again for the next one (a warning says so); closing stops the process."""
    env = build_env(units_cfg({"name": "units", "command": ["python", SERVER]}), ROOT)
    assert isinstance(env, ToolEnv)
    tool = env.tool("convert")
    assert isinstance(tool, McpTool), "an MCP tool must not be wrapped in a sandbox worker"
    params = tool.parameters
    assert params["required"] == ["value", "from_unit", "to_unit"] and params["additionalProperties"] is False
    assert params["properties"]["value"] == {"type": "number"}, "pydantic titles must not reach the prompt"
    assert env.parse('<tool_call>{"name": "convert", "arguments": {"value": "x", "from_unit": "km", '
                     '"to_unit": "m"}}</tool_call>').kind != "tool_call"
    good, unknown = tool.run_batch([{"value": 3, "from_unit": "km", "to_unit": "m"},
                                    {"value": 3, "from_unit": "parsec", "to_unit": "m"}])
    assert good[0].text == "3000 m" and good[1] is False
    assert unknown[1] is True and "unknown unit" in unknown[0].text
    (first,) = server_processes()
    first.kill()
    first.wait(10)
    with caplog.at_level(logging.WARNING, logger="agentr1.env.mcp"):
        (lost,) = tool.run_batch([{"value": 1, "from_unit": "km", "to_unit": "m"}])
        assert lost[1] is True and "stopped answering" in lost[0].text
        (again,) = tool.run_batch([{"value": 2, "from_unit": "km", "to_unit": "m"}])
    assert again == (again[0], False) and again[0].text == "2000 m"
    assert tool.server.starts == 2 and "starting it again" in caplog.text
    (second,) = server_processes()
    assert second.pid != first.pid
    tool.server.close()
    assert not second.is_running() or second.status() == psutil.STATUS_ZOMBIE


def test_listed_schemas_become_what_the_parser_checks_or_one_clear_error():
    """Optional[list[str]] (anyOf with items) keeps its item type and accepts null; a schema the
    parser cannot read ($ref, a bare `true`) is refused when the server starts, naming the server,
    tool and argument: it once made the tool silently uncallable, or raised on every call."""
    from types import SimpleNamespace

    from agentr1.env.mcp import tool_schema
    from agentr1.env.protocol import argument_problem
    from agentr1.env.tools import ToolDefinitionError

    def listed(props):
        return SimpleNamespace(name="t", description="T.", input_schema={"type": "object", "properties": props})

    tags = {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}], "default": None,
            "title": "Tags"}
    params = tool_schema("srv", listed({"tags": tags}))["function"]["parameters"]
    assert params["properties"]["tags"] == {"type": "array", "items": {"type": "string"}, "default": None,
                                            "nullable": True}
    assert argument_problem({"tags": ["a", "b"]}, params, 100) is None
    assert argument_problem({"tags": None}, params, 100) is None
    assert argument_problem({"tags": [1]}, params, 100) == "arguments.tags[0] must be a non-empty string"
    nested = {"type": "object", "properties": {"p": {"oneOf": [{"type": "integer"}]}}}
    for bad, word in (({"$ref": "#/$defs/Point"}, "its schema uses $ref"), (True, "its schema is True"),
                      (nested, "its schema uses oneOf")):
        with pytest.raises(ToolDefinitionError, match=f"env.mcp 'srv': tool 't', argument 'x': {re.escape(word)}"):
            tool_schema("srv", listed({"x": bad}))


def test_a_server_that_cannot_start_or_lacks_a_tool_is_one_clear_error():
    crash = "import sys; sys.stderr.write('cannot open the catalogue'); sys.exit(3)"
    with pytest.raises(McpError, match=r"env.mcp 'broken' .*did not start(.|\n)*cannot open the catalogue"):
        mcp_tools(units_cfg({"name": "broken", "command": ["python", "-c", crash]}))
    with pytest.raises(McpError, match=r"lists no tool 'lookup_price'; it lists convert"):
        mcp_tools(units_cfg({"name": "units", "command": ["python", SERVER], "tools": ["lookup_price"]}))
    with pytest.raises(ValueError, match="exactly one of command"):
        units_cfg({"name": "both", "command": ["python", SERVER], "url": "http://127.0.0.1:1/mcp"})


def test_a_streamable_http_server_on_localhost():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.2)
        (tool,) = mcp_tools(units_cfg({"name": "units", "url": f"http://127.0.0.1:{port}/mcp"}))
        assert tool.run_batch([{"value": 5, "from_unit": "m", "to_unit": "cm"}]) == [(ToolOutput("500 cm"), False)]
        tool.server.close()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_mcp_serve_answers_the_sdks_client(data_dir, tmp_path):  # noqa: F811
    """`agentr1 mcp-serve` over stdio: tools/list gives the search tool's schema, tools/call its
    hits with their document ids as structured keys, and a bad call an isError result."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def session_calls():
        params = StdioServerParameters(command=sys.executable, args=["-m", "cli", "mcp-serve", "--data", str(data_dir)],
                                       cwd=str(ROOT), env={k: v for k, v in os.environ.items()})
        with open(tmp_path / "stderr.txt", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                listed = await s.list_tools()
                hit = await s.call_tool("search", {"query": "directed"})
                bad = await s.call_tool("search", {"q": 1})
        return listed, hit, bad

    listed, hit, bad = asyncio.run(asyncio.wait_for(session_calls(), 120))
    assert [t.name for t in listed.tools] == ["search"]
    assert listed.tools[0].input_schema["required"] == ["query"]
    assert not hit.is_error and hit.content[0].text and hit.structured_content["keys"]
    assert bad.is_error and "arguments.query" in bad.content[0].text


def test_a_logged_model_carries_the_servers_script():
    cfg = units_cfg({"name": "units", "command": ["python", SERVER, "--flag"]})
    assert command_files(cfg.env.mcp, ROOT) == {(0, 1): (ROOT / SERVER).resolve()}


@pytest.mark.slow
def test_an_agent_trains_on_an_mcp_tool_end_to_end_through_a_server_crash(prefect_api, fresh_store, tmp_path,  # noqa: F811
                                                                          caplog):
    """conf/units-mcp.yaml's agent on a tiny budget through the pipeline flow: warm-up, PPO,
    evaluation and registration, while its MCP server crashes once mid-run (the documented
    behaviour: that call fails, the server starts again, the run goes on); then the registered
    model, loaded as MLflow serves it, starts its own copy of the server and answers."""
    import mlflow
    import pandas as pd

    from agentr1.recipe.workspace import ensure_data
    from flows.pipeline import pipeline
    from adapters import tracking

    data = tmp_path / "data"
    ensure_data(load_config("conf/units.yaml", [f"data.dir={data}", "data.synth.n_train=48", "data.synth.n_dev=4",
                                                "data.synth.n_test=8"]))
    marker = tmp_path / "crashed"
    server = {"name": "units", "command": ["python", FLAKY], "env": {"CRASH_MARKER": str(marker), "CRASH_AT": "30",
                                                                    "UNITS_SERVER": str(ROOT / SERVER)}}
    overrides = [f"data.dir={data}", f"env.mcp={json.dumps([server])}", "sft.episodes=48", "sft.steps=4",
                 "sft.batch_size=8", "sft.warmup_steps=1", "ppo.iterations=2", "ppo.episodes_per_iter=8",
                 "ppo.minibatch_size=8", "eval.batch_size=8", "model.vocab_size=300", "model.hidden_size=32",
                 "model.num_layers=1"]
    params = PipelineParams(preset="conf/units-mcp.yaml", overrides=overrides, output_dir=str(tmp_path / "run"),
                            data=DataSource(version=False))
    with caplog.at_level(logging.WARNING, logger="agentr1.env.mcp"):
        result = pipeline(params)
    assert marker.read_text().startswith("crashed at call 30"), "the server never crashed: the test proved nothing"
    assert "starting it again" in caplog.text
    assert result["iterations"] == 2 and result["registered_version"]
    assert set(result["final"]) >= {"greedy/em", "sampled/em"}
    assert '"name": "convert"' in (tmp_path / "run" / "trajectories_final.txt").read_text()

    tracking.client()  # MLflow's global URI: this test's store
    served = mlflow.pyfunc.load_model(f"models:/{result['registered_model']}/{result['registered_version']}")
    command = served.unwrap_python_model().agent.cfg.env.mcp[0].command
    assert command[1] != FLAKY and Path(command[1]).name == Path(FLAKY).name and Path(command[1]).is_file(), \
        "the served model must start its own copy of the server's script"
    (answer,) = served.predict(pd.DataFrame({"question": ["How many m is 3 km?"]}))
    assert isinstance(answer["answer"], str | None) and answer["turns"]
    served.unwrap_python_model().agent.env.tool("convert").server.close()
