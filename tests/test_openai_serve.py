"""`agentr1 serve`: the trained policy behind OpenAI's chat-completions protocol, driven by the
official `openai` client on localhost (a tool round trip, streaming, refusals as HTTP 400), and
the mapping of a conversation onto the training format (agentr1/openai_chat.py)."""
from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest

from agentr1.env.protocol import format_answer, format_call
from agentr1.openai_chat import ChatRequestError, episode

SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the documents.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}


def _call(name: str, arguments: dict, call_id: str = "call_1") -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_a_conversation_maps_onto_the_training_format():
    messages = [{"role": "user", "content": [{"type": "text", "text": "Who founded "}, {"type": "text", "text": "X?"}]},
                _call("search", {"query": "X"}), {"role": "tool", "tool_call_id": "call_1", "content": "doc one"},
                {"role": "tool", "tool_call_id": "call_1", "content": "doc two"}]
    system, question, turns = episode(messages)
    assert system is False and question == "Who founded X?"  # no system message: the run's own
    assert turns == [(format_call("search", {"query": "X"}), "doc one\n\ndoc two")]
    # An empty system message removes the system turn; an assistant's text is its answer turn.
    system, _, turns = episode([{"role": "system", "content": ""}, {"role": "user", "content": "q"},
                                _call("search", {"query": "q"}), {"role": "tool", "content": "r"},
                                {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
                                {"role": "tool", "content": "s"}])
    assert system is None and turns[1] == ("<tool_call>{}</tool_call>", "s")
    with pytest.raises(ChatRequestError, match=r"messages\[2\].role: 'tool' here; expected nothing after the answer"):
        episode([{"role": "user", "content": "q"}, {"role": "assistant", "content": "plain"},
                 {"role": "tool", "content": "x"}])
    assert format_answer("plain") == "<answer>plain</answer>"


@pytest.mark.parametrize("messages, said", [
    ([], "messages must be a non-empty list"),
    ([{"role": "assistant", "content": "hi"}], "messages[0].role: 'assistant' here; expected a user message"),
    ([{"role": "user", "content": "q"}, {"role": "user", "content": "again"}], "messages[1].role: 'user' here"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], "messages[1].role: 'tool' here"),
    ([{"role": "user", "content": "q"}, {**_call("search", {"query": "a"}), "tool_calls": [
        _call("search", {"query": "a"})["tool_calls"][0]] * 2}], "exactly one call per turn (got 2)"),
    ([{"role": "user", "content": "q"}, _call("search", {"query": "a"})], "ends with the model's own turn"),
    ([{"role": "user", "content": {"image": 1}}], "messages[0].content must be a string or a list of text parts"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "search", "arguments": "{not json"}}]}],
     "messages[1].tool_calls[0].function.arguments is not JSON"),
])
def test_requests_the_policy_cannot_answer_are_named(messages, said):
    with pytest.raises(ChatRequestError) as err:
        episode(messages)
    assert said in str(err.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=["scratch", "pretrained"])
def server(request, tmp_path_factory):
    """A tiny policy warmed up on the expert's demonstrations (it learns the call-then-answer
    format in ~100 steps), served by `agentr1 serve`'s app on a free localhost port: a scratch
    model, and a pretrained-path one (a tiny Qwen2.5-like instruct checkpoint: its ChatML
    template and Hermes tool tags, loaded as model.kind=pretrained)."""
    import uvicorn

    from agentr1.agent import Agent
    from agentr1.config import load_config
    from agentr1.data.records import corpus_path
    from agentr1.env.registry import resolve
    from agentr1.openai_chat import ChatCompletions
    from agentr1.recipe.warmup import warmup
    from agentr1.recipe.workspace import Workspace
    from cli.serve import make_app

    root = tmp_path_factory.mktemp("serve")
    overrides = [f"data.dir={root / 'data'}", f"output_dir={root / 'run'}", "data.synth.n_train=400",
                 "data.synth.n_dev=4", "data.synth.n_test=16", "model.vocab_size=900", "model.hidden_size=64",
                 "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=128",
                 "sft.episodes=400", "sft.corpus_steps=0", "sft.steps=150", "sft.batch_size=16",
                 "sft.value_fit_episodes=0", "sft.expert.stop_short_3hop=0", "sft.expert.distractor=0",
                 "sft.expert.malformed=0", "rollout.backend=hf", "device=cpu"]
    if request.param == "pretrained":
        from agentr1.env.qa.synth import generate
        from test_models import make_tiny_qwen

        splits, corpus = generate(0, n_train=400, n_dev=4, n_test=16, names="small")
        texts = [f"{d.title}\n{d.text}" for d in corpus] + [r.question for r in splits["train"]]
        qwen = make_tiny_qwen(root / "tiny-qwen", texts, hidden_size=64, intermediate_size=128)
        overrides += ["model.kind=pretrained", f"model.name_or_path={qwen}"]
    cfg = resolve(load_config("conf/train.yaml", overrides))
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    agent = Agent(cfg, root / "run" / "warmup", corpus_path(cfg.data.dir))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(make_app(ChatCompletions(agent, "agentr1")), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield {"url": f"http://127.0.0.1:{port}/v1", "test": ws.split("test"), "env": agent.env, "agent": agent}
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.mark.slow  # ~30 s: a 150-step warm-up
def test_the_openai_client_makes_a_tool_round_trip(server):
    from openai import OpenAI

    client = OpenAI(base_url=server["url"], api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["agentr1"]
    record = server["test"][0]
    messages = [{"role": "user", "content": record.question}]
    first = client.chat.completions.create(model="agentr1", messages=messages, tools=[SEARCH], temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search"
    query = json.loads(call.function.arguments)["query"]
    assert isinstance(query, str) and query
    assert first.usage.completion_tokens > 0 and first.usage.prompt_tokens > 0

    def run_search(q: str) -> str:  # the client runs the tool: here, the project's own search
        (output, failed), = server["env"].tool("search").run_batch([{"query": q}])
        assert not failed
        return output.text

    observation = run_search(query)
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": observation}]
    turns = [first]
    for _ in range(4):  # the agent searches until it can answer (at most env.max_turns turns)
        reply = client.chat.completions.create(model="agentr1", messages=messages, tools=[SEARCH], temperature=0)
        turns.append(reply)
        if reply.choices[0].finish_reason != "tool_calls":
            break
        (call,) = reply.choices[0].message.tool_calls
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id,
                      "content": run_search(json.loads(call.function.arguments)["query"])}]
    last = turns[-1].choices[0]
    assert last.finish_reason == "stop" and last.message.content and not last.message.tool_calls, last


@pytest.mark.slow
def test_streaming_and_refusals_over_http(server):
    import openai
    from openai import OpenAI

    client = OpenAI(base_url=server["url"], api_key="unused", max_retries=0)
    question = [{"role": "user", "content": server["test"][1].question}]
    whole = client.chat.completions.create(model="agentr1", messages=question, tools=[SEARCH], temperature=0)
    chunks = list(client.chat.completions.create(model="agentr1", messages=question, tools=[SEARCH], temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
    streamed = chunks[0].choices[0].delta.tool_calls[0].function
    assert (streamed.name, streamed.arguments) == (whole.choices[0].message.tool_calls[0].function.name,
                                                   whole.choices[0].message.tool_calls[0].function.arguments)
    # A tool the request does not offer is not returned as a call: the text comes back as content.
    other = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    offered = client.chat.completions.create(model="agentr1", messages=question, tools=[other], temperature=0)
    assert offered.choices[0].finish_reason == "stop" and not offered.choices[0].message.tool_calls
    assert '"name": "search"' in offered.choices[0].message.content
    for bad, said in (({"messages": [{"role": "user", "content": "q"}] * 2}, "messages[1].role"),
                      ({"messages": question, "temperature": -1}, "temperature: -1 is out of range"),
                      ({"messages": question, "n": 2}, "n: this model returns one choice")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="agentr1", **bad)
        assert err.value.status_code == 400 and said in err.value.message
    with pytest.raises(openai.NotFoundError) as err:  # another model id: 404, as OpenAI's own API says it
        client.chat.completions.create(model="gpt-4", messages=question)
    assert err.value.status_code == 404 and err.value.code == "model_not_found" and "`agentr1`" in err.value.message
    import httpx  # a body that is not JSON at all: OpenAI's error object, not a traceback

    broken = httpx.post(f"{server['url']}/chat/completions", content=b"{not json",
                        headers={"Content-Type": "application/json"}, timeout=30)
    assert broken.status_code == 400
    assert broken.json()["error"]["type"] == "invalid_request_error" and "not JSON" in broken.json()["error"]["message"]
    # numbers JSON allows that no model can take, and a body nested past Python's recursion: 400, not 500
    q = json.dumps(question)
    for raw, said in ((f'{{"messages": {q}, "max_tokens": 1e400}}', "max_tokens"),
                      (f'{{"messages": {q}, "max_tokens": 2.5}}', "max_tokens"),
                      (f'{{"messages": {q}, "seed": 1e20, "temperature": 1}}', "seed"),
                      (f'{{"messages": {q}, "seed": {10 ** 400}}}', "seed"),
                      (f'{{"messages": {q}, "seed": -1}}', "seed"),
                      ("[" * 100_000 + "]" * 100_000, "nested too deeply")):
        answer = httpx.post(f"{server['url']}/chat/completions", content=raw.encode(),
                            headers={"Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == 400 and said in answer.json()["error"]["message"], (raw[:80], answer.text[:200])
    from cli.serve import MAX_BODY_BYTES

    huge = httpx.post(f"{server['url']}/chat/completions", content=b" " * (MAX_BODY_BYTES + 1),
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert huge.status_code == 413 and "over" in huge.json()["error"]["message"]


def test_serve_names_a_model_it_cannot_find_in_one_line(capsys):
    from cli.main import main

    assert main(["serve", "--model", "987654"]) == 2  # no such registered version (exit 2, no traceback)
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentr1: error: model '987654': no registered") and "agentr1 pipeline" in err
    assert main(["serve", "--model", "runs/no/such/dir"]) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.slow
def test_the_endpoint_prompts_as_training_did_and_concurrent_requests_do_not_mix(server):
    """The question reaches the policy as every episode puts it (the environment's user prompt,
    as in training and `agentr1 ask`), and concurrent requests get each its own prompt: the
    tokenizer's special-token switch is shared (a review saw 19 of 360 threaded prompts with
    <|im_start|> spelled out as text)."""
    from agentr1.agent import SOURCE
    from agentr1.data.records import QARecord
    from agentr1.openai_chat import ChatCompletions

    agent = server["agent"]
    completions, chat, env = ChatCompletions(agent, "agentr1"), agent.engine.chat, agent.env
    q = server["test"][0].question
    record = QARecord(id="0", question=q, answers=(), supporting_docs=(), hops=1, source=SOURCE)
    assert completions._prompt([{"role": "user", "content": q}]) == chat.prompt_ids(env.system_turn(),
                                                                                    env.user_prompt(record))
    big = "founded by Romilga. " * 4000  # a long tool result: encoded as data, with split_special_tokens
    with_tool = [{"role": "user", "content": q},
                 {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                     "name": "search", "arguments": json.dumps({"query": q[:20]})}}]},
                 {"role": "tool", "tool_call_id": "c", "content": big}]
    plain = [{"role": "user", "content": q * 40}]
    expected = {0: completions._prompt(with_tool), 1: completions._prompt(plain)}
    wrong: list[int] = []

    def worker(k: int) -> None:
        for _ in range(40):
            if completions._prompt(with_tool if k % 2 == 0 else plain) != expected[k % 2]:
                wrong.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@pytest.mark.slow
def test_hostile_request_fields_are_refused_not_crashed_on(server):
    """Null sampling fields mean their defaults (as in OpenAI's API); text that is not valid
    Unicode, numbers past Python's digit limit and nesting past its recursion limit inside a tool
    call's arguments, and oversized arguments are HTTP 400 naming the field: never a 500."""
    import httpx

    question = [{"role": "user", "content": server["test"][1].question}]
    post = lambda body: httpx.post(f"{server['url']}/chat/completions", content=body.encode(),  # noqa: E731
                                   headers={"Content-Type": "application/json"}, timeout=60)
    for field in ("temperature", "top_p", "seed", "n", "max_tokens"):
        assert post(json.dumps({"messages": question, field: None})).status_code == 200, field

    def call(arguments: str) -> str:
        return json.dumps({"messages": [*question, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "search", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "x"}]})

    for body, said in (('{"messages": [{"role": "user", "content": "\\ud800 who?"}]}', "not valid Unicode"),
                       (f'{{"messages": {json.dumps(question)}, "seed": {"1" * 5000}}}', "not JSON"),
                       (call('{"query": ' + "1" * 5000 + "}"), "function.arguments is not JSON"),
                       (call("[" * 50_000 + "]" * 50_000), "nested too deeply"),
                       (call(json.dumps({"query": "x" * 200_000})), "function.arguments has 200")):
        answer = post(body)
        assert answer.status_code == 400 and said in answer.json()["error"]["message"], (said, answer.text[:200])


def _hostile_bodies(question: str, n: int, seed: int = 5) -> list[object]:
    """``n`` generated request bodies, each one field of a valid request made hostile: a wrong type,
    a junk role or content, a malformed tool call, a huge or deeply nested value, a sampling
    number out of range or not finite."""
    rng = random.Random(seed)
    junk = [None, True, -1, 2**70, 1e308, float("nan"), "", "x" * 100_000, [], {}, [[[]]], {"a": {"b": 1}},
            "<|im_start|>system", "\udcff", "\u0000", ["user"], {"role": "user"}]
    good_call = {"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"query": "x"}'}}
    fields = {
        "messages": lambda: rng.choice(junk),
        "role": lambda: [{"role": rng.choice(junk + ["robot", "function", "developer "]), "content": question}],
        "content": lambda: [{"role": "user", "content": rng.choice(junk)}],
        "tool_call": lambda: [{"role": "user", "content": question},
                              {"role": "assistant", "tool_calls": [{**good_call, rng.choice(["id", "type", "function"]):
                                                                    rng.choice(junk)}]},
                              {"role": "tool", "tool_call_id": "c", "content": "x"}],
        "arguments": lambda: [{"role": "user", "content": question},
                              {"role": "assistant", "tool_calls": [{**good_call, "function": {
                                  "name": rng.choice(junk + ["search"]), "arguments": rng.choice(junk)}}]},
                              {"role": "tool", "tool_call_id": rng.choice(junk + ["c"]), "content": rng.choice(junk)}],
        "sampling": lambda: [{"role": "user", "content": question}],
    }
    bodies: list[object] = []
    for i in range(n):
        kind = list(fields)[i % len(fields)]
        body = {"messages": fields[kind]()}
        if kind == "sampling":
            body[rng.choice(["temperature", "top_p", "max_tokens", "n", "seed", "stream", "tools", "tool_choice",
                             "model", "stop"])] = rng.choice(junk)
        bodies.append(body)
    return bodies


@pytest.mark.slow
def test_fifty_generated_hostile_requests_get_an_answer_or_a_400_never_a_500(server):
    """The hostile harness's OpenAI part: 50 generated request bodies (plus raw bytes that are
    not JSON) each get a 200 or an OpenAI-shaped 4xx naming what is wrong, none a 5xx or a hang,
    and the server answers a plain question afterwards."""
    import httpx

    question = server["test"][1].question
    url = f"{server['url']}/chat/completions"
    statuses = []
    raw = [b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"messages": [' + b"[" * 10_000]
    bodies = [json.dumps(b, allow_nan=True).encode() for b in _hostile_bodies(question, 50)] + raw
    for body in bodies:
        answer = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=60)
        statuses.append(answer.status_code)
        assert answer.status_code == 200 or 400 <= answer.status_code < 500, (body[:200], answer.text[:300])
        if answer.status_code != 200:
            assert answer.json()["error"]["message"], answer.text[:300]
    assert statuses.count(200) < len(statuses) and sum(400 <= s < 500 for s in statuses) > len(statuses) // 2
    plain = httpx.post(url, json={"messages": [{"role": "user", "content": question}]}, timeout=60)
    assert plain.status_code == 200


@pytest.mark.slow
def test_a_non_boolean_stream_and_a_conversation_past_max_turns_are_refused(server):
    """OpenAI's stream is a boolean ("yes" was taken for true); the endpoint answers within the
    turns the run trained with (env.max_turns), as every episode did (issue 48)."""
    import httpx

    question = [{"role": "user", "content": server["test"][1].question}]
    post = lambda body: httpx.post(f"{server['url']}/chat/completions", json=body, timeout=60)  # noqa: E731
    for value in ("yes", 1, "true"):
        answer = post({"messages": question, "stream": value})
        assert answer.status_code == 400 and "stream: must be true or false" in answer.json()["error"]["message"]
    assert post({"messages": question, "stream": False}).status_code == 200
    turn = [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "search", "arguments": json.dumps({"query": "x"})}}]}, {"role": "tool", "tool_call_id": "c", "content": "x"}]
    limit = server["env"].settings.max_turns
    assert post({"messages": question + turn * (limit - 1)}).status_code == 200
    answer = post({"messages": question + turn * limit})
    assert answer.status_code == 400 and f"answers within {limit} (env.max_turns)" in answer.json()["error"]["message"]
