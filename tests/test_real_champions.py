"""The real benchmarks' champions answer as the search agent's do: a function caller (BFCL) and a
calculator agent (word problems), each trained for a few warm-up steps on its preset's own data,
logged, registered and made its kind's champion, then asked through `agentr1 ask`, the MLflow
model and the OpenAI endpoint. A tiny scratch policy keeps this fast (60 warm-up steps: the calculator agent then calls
`calculate` and answers; the function caller writes a broken call); every path must give the
episode the policy itself plays for the same question (greedy), whatever that episode is."""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from agentr1.config import load_config
from adapters import lifecycle, tracking

REAL = Path(__file__).resolve().parents[2] / "shared" / "realdata"
PRESETS = {"function_call": "conf/bfcl-smollm2.yaml", "math_tool": "conf/calculator-smollm2.yaml"}
TINY = ["model.kind=scratch", "model.name_or_path=null", "model.trainable_layers=null", "model.vocab_size=600",
        "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=2",
        "model.intermediate_size=128", "model.max_position_embeddings=2048", "sft.episodes=480", "sft.steps=60",
        "sft.lr=3e-3", "sft.batch_size=8", "rollout.backend=hf", "rollout.dtype=auto", "device=cpu"]
QUESTIONS = 2


@pytest.fixture(scope="module", params=sorted(PRESETS))
def champion(request, tmp_path_factory) -> dict:
    """A kind's trained champion (``models:/agentr1-policy-<kind>@champion`` in this test's store),
    the policy directory it came from and a few test questions (with their functions)."""
    from agentr1.agent import Agent
    from agentr1.env.registry import resolve
    from agentr1.recipe.warmup import warmup
    from agentr1.recipe.workspace import Workspace

    kind = request.param
    if kind == "function_call":
        pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by make setup")
    elif not REAL.is_dir():
        pytest.skip(f"{REAL}: the shared real data is not beside this checkout")
    root = tmp_path_factory.mktemp(kind)
    cfg = resolve(load_config(PRESETS[kind], [f"data.dir={root / 'data'}", f"output_dir={root / 'run'}", *TINY]))
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    policy = root / "run" / "warmup"
    name = tracking.model_name(kind)
    with lifecycle.start_run("agentr1-test", f"champion-{kind}") as run_id:
        uri = tracking.log_policy_model(run_id, policy, cfg, name=name)
    tracking.set_champion(name, tracking.register(uri, name))
    records = ws.split("test")[:QUESTIONS]
    functions = [r.meta["functions"] for r in records] if kind == "function_call" else None
    mine = Agent(cfg, policy, cfg.data.dir).answer([r.question for r in records], functions=functions)
    return {"kind": kind, "uri": f"models:/{name}@{tracking.CHAMPION}", "records": records,
            "functions": functions, "expected": mine, "root": root}


def _same_episode(got: dict, expected: dict) -> None:
    for key in ("question", "answer", "tool_calls", "turns", "finish"):
        assert got[key] == expected[key], key


def test_the_champion_is_its_kinds_own(champion):
    entry = tracking.champion_entry(tracking.model_name(champion["kind"]))
    assert entry is not None and entry.name == f"agentr1-policy-{champion['kind']}" != tracking.MODEL_NAME


def test_ask_answers_with_the_champion(champion, capsys, tmp_path):
    from cli.main import main

    for record, expected, i in zip(champion["records"], champion["expected"], range(QUESTIONS)):
        extra = []
        if champion["functions"]:
            path = tmp_path / f"functions-{i}.json"
            path.write_text(json.dumps(champion["functions"][i]))
            extra = ["--functions", str(path)]
        assert main(["ask", "--model", champion["uri"], "--json", *extra, record.question]) == 0
        out = json.loads(capsys.readouterr().out)
        _same_episode(out["results"][0], expected)


def test_the_mlflow_model_answers_like_the_policy(champion):
    model = mlflow.pyfunc.load_model(champion["uri"])
    frame = pd.DataFrame({tracking.QUESTION: [r.question for r in champion["records"]]})
    if champion["functions"]:
        frame[tracking.FUNCTIONS] = [json.dumps(f) for f in champion["functions"]]
    for got, expected in zip(model.predict(frame), champion["expected"]):
        _same_episode(got, expected)


def test_the_openai_endpoint_answers_the_episodes_first_turn(champion):
    """One request with the question (and, for the function caller, its functions as OpenAI
    tools): the reply is the episode's first turn, a call as ``tool_calls`` or the answer."""
    from fastapi.testclient import TestClient

    from agentr1.openai_chat import ChatCompletions
    from cli.agents import load_agent
    from cli.serve import make_app

    class Args:
        model, corpus = champion["uri"], None

    _, agent = load_agent(Args)
    client = TestClient(make_app(ChatCompletions(agent, "agentr1")))
    for i, (record, expected) in enumerate(zip(champion["records"], champion["expected"])):
        body = {"model": "agentr1", "messages": [{"role": "user", "content": record.question}], "temperature": 0}
        if champion["functions"]:
            body["tools"] = [{"type": "function", "function": f} for f in champion["functions"][i]]
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        message = reply.json()["choices"][0]["message"]
        first = agent.env.parse(expected["transcript"][0]["text"])
        offered = {t["function"]["name"] for t in body.get("tools", [])}
        if first.kind == "tool_call" and (not offered or first.name in offered):
            (call,) = message["tool_calls"]
            assert call["function"]["name"] == first.name
            assert json.loads(call["function"]["arguments"]) == first.arguments
        else:
            assert not message.get("tool_calls")
            if first.kind == "answer":
                assert message["content"] == first.answer

