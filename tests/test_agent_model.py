"""The logged agent: models-from-code, full multi-turn episodes in predict, MLflow's own
scoring server, input validation (4xx, not a crash), another corpus at load time, and
``agentr1 ask``. A tiny random policy keeps this fast: its answers are rarely right, so the
checks compare with the environment's own episode of the same question instead."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from agentr1.agent import MAX_QUESTION_CHARS, transcript
from cli.main import main
from agentr1.config import ModelConfig, load_config
from agentr1.data.records import load_dataset
from agentr1.env.rewards import exact_match
from agentr1.episode import Trajectory
from agentr1.recipe.workspace import ensure_data
from adapters import lifecycle, tracking

TINY = ["data.synth.n_train=24", "data.synth.n_dev=2", "data.synth.n_test=8", "env.max_turns=2",
        "env.max_turn_tokens=8", "env.max_context_tokens=300", "rollout.backend=hf", "device=cpu"]
SERVER_START_S = 120
STOP_S = 20
QUESTIONS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _venv_env() -> dict[str, str]:
    """This environment with the interpreter's bin directory first on PATH: MLflow's server
    starts ``uvicorn`` by name, as an activated virtualenv would find it."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _stop(server: subprocess.Popen) -> None:
    """End the server's whole process group (MLflow's CLI, its shell, uvicorn and the worker)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A tiny dataset, the run config and a random policy whose tokenizer knows its words."""
    from models.policy import ModelSpec, build_policy, save_actor_critic
    from models.tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("agent")
    cfg = load_config("conf/train.yaml", [f"data.dir={root / 'data'}", *TINY])
    ensure_data(cfg)
    splits, corpus = load_dataset(cfg.data.dir)
    tok = build_tokenizer([f"{d.title}\n{d.text}" for d in corpus] + [r.question for r in splits["train"]],
                          vocab_size=400)
    spec = ModelSpec.from_config(ModelConfig(), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2,
                                 intermediate_size=32)
    policy = build_policy(spec, tok)
    return {"cfg": cfg, "test": splits["test"], "corpus": corpus,
            "policy": save_actor_critic(policy, tok, root / "policy")}


@pytest.fixture(scope="module")
def registered(world) -> str:
    """``models:/<unique name>/1``: the agent logged and registered."""
    name = f"agentr1-agent-test-{uuid.uuid4().hex[:6]}"
    with lifecycle.start_run("agentr1-test", "agent") as run_id:
        uri = tracking.log_policy_model(run_id, world["policy"], world["cfg"])
    return f"models:/{name}/{tracking.register(uri, name)}"


@pytest.fixture(scope="module")
def model(registered):
    return mlflow.pyfunc.load_model(registered)


def _questions(world, n: int = QUESTIONS) -> list[str]:
    return [r.question for r in world["test"][:n]]


def test_transcript_pairs_each_call_with_its_result_and_reads_the_answer():
    traj = Trajectory("q", [], [], [], 0, finish="answer",
                      turn_texts=['<tool_call>{"name": "search", "arguments": {"query": "Kelmora"}}</tool_call>',
                                  "no tags", "<answer>Drastin Vole</answer>"],
                      observations=["Doc 1 (Kelmora): born in Vole.", "Error: no tool call or answer"])
    from agentr1.config import EnvConfig, RewardConfig
    from agentr1.env.base import EnvSettings, ToolEnv
    from agentr1.env.rewards import RewardWeights
    from agentr1.env.qa.search import SearchTool
    from agentr1.env.tools import Tool

    # The environment's parser is all a transcript needs: the search tool's schema, no index.
    env = ToolEnv([Tool.from_callable(SearchTool(None, 1, None, False))], EnvSettings.from_config(EnvConfig()),
                  RewardWeights.from_config(RewardConfig()))
    out = transcript("Who?", traj, env)
    assert out["tool_calls"] == [{"name": "search", "arguments": {"query": "Kelmora"},
                                  "result": "Doc 1 (Kelmora): born in Vole."}]
    assert out["answer"] == "Drastin Vole" and exact_match(out["answer"], ["drastin vole"]) == 1.0
    assert out["turns"] == 3 and out["finish"] == "answer"
    assert [p["role"] for p in out["transcript"]] == ["assistant", "tool", "assistant", "tool", "assistant"]


def test_the_model_is_code_plus_artifacts_with_the_runs_settings(registered, world):
    local = Path(mlflow.artifacts.download_artifacts(registered))
    files = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    assert "agent_model.py" in {Path(f).name for f in files}  # the model is this code file
    assert not any(f.endswith(".pkl") for f in files), "loading must unpickle nothing"
    assert "artifacts/resources/corpus.jsonl" in files  # the dataset's resources, one directory
    assert any(f.startswith("artifacts/") and f.endswith("/value_head.safetensors") for f in files)
    conf = mlflow.models.Model.load(local).flavors["python_function"]["config"]  # the logged model_config
    assert conf["config"]["env"] == world["cfg"].env.model_dump(mode="json")
    assert conf["config"]["rollout"]["backend"] == "hf" and conf["corpus"] is None


def test_predict_plays_the_environments_episodes(model, world):
    from agentr1.agent import Agent

    questions = _questions(world)
    out = model.predict(pd.DataFrame({"question": questions}))
    assert [r["question"] for r in out] == questions
    assert model.predict(pd.DataFrame({"question": questions})) == out  # greedy: deterministic
    max_turns = world["cfg"].env.max_turns
    for r in out:
        assert 1 <= r["turns"] <= max_turns and r["finish"] in {"answer", "max_turns", "context"}
        assert (r["answer"] is not None) == (r["finish"] == "answer")
    # The environment's own greedy episodes of the same records (gold answers known) score
    # what the model answered exactly as the scorer scores it.
    agent = model.unwrap_python_model().agent
    trajs = agent.engine.run(world["test"][:QUESTIONS], seed=0, temperature=0.0)
    for r, t, rec in zip(out, trajs, world["test"]):
        assert exact_match(r["answer"], rec.answers) == t.metrics["em"]
        assert r["turns"] == t.metrics["turns"] and len(r["tool_calls"]) == t.metrics["n_calls"]
    assert isinstance(agent, Agent)


def _without_ids(out: dict) -> list:
    """Responses output items or ChatAgent messages, ids (random per response) left out."""
    rows = out.get("output") or out["messages"]
    drop = {"id", "call_id", "tool_call_id"}
    return [{k: v for k, v in row.items() if k not in drop and k != "tool_calls"}
            | ({"calls": [c["function"] for c in row["tool_calls"]]} if row.get("tool_calls") else {})
            for row in rows]


def test_agent_requests_answer_in_mlflows_agent_shapes(model, world):
    """A Responses ("input") or ChatAgent ("messages") request is one conversation; its last user
    message is the question, and the episode comes back in that shape (checked with MLflow's own
    response types), the same episode as the question shape's."""
    from mlflow.types.agent import ChatAgentResponse
    from mlflow.types.responses import ResponsesAgentResponse

    question = _questions(world, 1)[0]
    (plain,) = model.predict(pd.DataFrame({"question": [question]}))
    conversation = [{"role": "system", "content": "ignored"}, {"role": "user", "content": question}]
    responses = model.predict({"input": conversation})
    parsed = ResponsesAgentResponse(**responses)
    calls = [item for item in parsed.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(c["name"], c["arguments"]) for c in plain["tool_calls"]]
    outputs = {item.call_id: item.output for item in parsed.output if item.type == "function_call_output"}
    assert [outputs.get(c.call_id) for c in calls] == [c["result"] for c in plain["tool_calls"]]
    assert parsed.output[-1].type == "message" and parsed.output[-1].content[0]["text"] == (plain["answer"] or "")
    assert responses["custom_outputs"] == {"finish": plain["finish"], "turns": plain["turns"]}
    chat = model.predict({"messages": conversation})
    parsed = ChatAgentResponse(**chat)
    assert parsed.messages[-1].role == "assistant" and parsed.messages[-1].content == (plain["answer"] or "")
    assert [m.tool_calls[0].function.name for m in parsed.messages if m.tool_calls] == \
        [c["name"] for c in plain["tool_calls"]]
    for bad, says in (({"input": [{"role": "assistant", "content": "hi"}]}, "no user message"),
                      ({"messages": [{"role": "user", "content": "  "}]}, "empty")):
        with pytest.raises(MlflowException) as err:
            model.predict(bad)
        assert err.value.error_code == "INVALID_PARAMETER_VALUE" and says in err.value.message


def test_sampling_is_an_option_and_reproducible(model, world):
    frame = pd.DataFrame({"question": _questions(world)})
    a = model.predict(frame, params={"temperature": 1.0, "seed": 7})
    assert model.predict(frame, params={"temperature": 1.0, "seed": 7}) == a


@pytest.mark.parametrize("frame, says", [
    (pd.DataFrame({"query": ["Who?"]}), "question"),
    (pd.DataFrame({"question": ["Who?", "  "]}), "row 1"),
    (pd.DataFrame({"question": ["x" * 100_000]}), str(MAX_QUESTION_CHARS)),
])
def test_bad_input_is_an_invalid_parameter_error(model, frame, says):
    with pytest.raises(MlflowException) as err:
        model.predict(frame)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE" and says in err.value.message


def test_a_lone_surrogate_is_an_invalid_parameter_error(model):
    """A JSON \\ud800 escape in an agent request (pandas itself refuses one in a column) is a 4xx
    naming the field, not a tokenizer's TypeError."""
    request = pd.DataFrame({"input": [[{"role": "user", "content": "\ud800 who?"}]]})
    with pytest.raises(MlflowException) as err:  # the model itself, as a scoring server hands it a request
        model.unwrap_python_model().predict(None, request)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE" and "not valid Unicode" in err.value.message


@pytest.mark.parametrize("temperature", [-1.0, float("inf")])
def test_a_temperature_out_of_range_is_refused(model, world, temperature):
    with pytest.raises(MlflowException, match="temperature must be a finite number >= 0"):
        model.predict(pd.DataFrame({"question": _questions(world, 1)}), params={"temperature": temperature})


def test_another_corpus_at_load_time(registered, world, tmp_path):
    other = tmp_path / "corpus.jsonl"
    docs = world["corpus"][:5]
    other.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    loaded = mlflow.pyfunc.load_model(registered, model_config={"corpus": str(other)})
    assert [d.id for d in loaded.unwrap_python_model().agent.engine.env.search.docs] == [d.id for d in docs]


def test_served_episodes_are_traces_when_asked(registered, world):
    """model_config trace_experiment: each episode the model plays is an MLflow trace there."""
    name = f"served-{uuid.uuid4().hex[:6]}"
    loaded = mlflow.pyfunc.load_model(registered, model_config={"trace_experiment": name})
    (result,) = loaded.predict(pd.DataFrame({"question": _questions(world, 1)}))
    mlflow.flush_trace_async_logging()
    experiment = mlflow.get_experiment_by_name(name).experiment_id
    (trace,) = mlflow.search_traces(locations=[experiment], return_type="list")
    root = next(s for s in trace.data.spans if s.name == "episode")
    assert root.inputs["question"] == result["question"] and root.outputs["answer"] == result["answer"]
    assert sum(s.span_type == "LLM" for s in trace.data.spans) == result["turns"]


@contextlib.contextmanager
def scoring_server(model_uri: str):
    """``mlflow models serve`` of ``model_uri`` on a free local port, once it answers /ping: its URL."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
         "-p", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=_venv_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the scoring server did not start"
            time.sleep(0.5)
        yield url
    finally:
        _stop(server)


def post_questions(url: str, questions: list[str]) -> tuple[int, object]:
    """POST ``questions`` to a scoring server's /invocations: (HTTP status, JSON body)."""
    body = {"dataframe_split": {"columns": ["question"], "data": [[q] for q in questions]}}
    req = urllib.request.Request(f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_served_by_mlflow_answers_like_predict_and_refuses_bad_input(registered, model, world):
    with scoring_server(registered) as url:
        def post(questions: list[str]):
            return post_questions(url, questions)

        questions = _questions(world)
        status, body = post(questions)
        assert status == 200
        served = body["predictions"]
        assert served == model.predict(pd.DataFrame({"question": questions}))
        for r, rec in zip(served, world["test"]):
            assert exact_match(r["answer"], rec.answers) in (0.0, 1.0)  # the scorer reads the served answer
        # MLflow's agent request shapes, as plain JSON bodies (its "unified LLM input")
        responses_request = {"input": [{"role": "user", "content": questions[0]}]}
        req = urllib.request.Request(f"{url}/invocations", json.dumps(responses_request).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200
            assert _without_ids(json.loads(resp.read())) == _without_ids(model.predict(responses_request))
        status, body = post([""])
        assert status == 400 and "empty" in body["message"]
        assert post(["x" * 100_000])[0] == 400
        assert post(questions[:1])[0] == 200  # a refused request leaves the server serving


def test_ask_cli_answers_with_json(registered, world, capsys):
    question = _questions(world, 1)[0]
    assert main(["ask", "--model", registered, "--json", question]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == registered and out["results"][0]["question"] == question
    assert main(["ask", "--model", registered, question]) == 0
    assert "A: " in capsys.readouterr().out


def test_ask_cli_refuses_unknown_models_and_empty_questions(world, capsys):
    assert main(["ask", "--model", "models:/no-such-agent/1", "Who?"]) == 2
    assert "no registered" in capsys.readouterr().err
    assert main(["ask", "--model", str(world["policy"]), ""]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["ask", "--model", str(world["policy"]), "\udcff who?"]) == 2  # a non-UTF-8 byte in argv
    assert "not valid Unicode" in capsys.readouterr().err
