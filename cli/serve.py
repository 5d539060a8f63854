"""``agentr1 serve``: the trained policy behind an OpenAI-compatible endpoint.

    agentr1 serve --model champion [--host 127.0.0.1] [--port 8000]

``POST /v1/chat/completions`` answers one assistant turn in OpenAI's shape (``tool_calls`` with
``finish_reason: "tool_calls"``, or the answer as ``content``), streamed as server-sent events
when ``stream`` is true; ``GET /v1/models`` lists the one model; a request the model cannot
answer is HTTP 400 with OpenAI's error object. The protocol mapping is
:mod:`agentr1.openai_chat`; this module is only the HTTP layer (FastAPI, uvicorn). Any OpenAI
client works against it::

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.chat.completions.create(model="agentr1", messages=[...], tools=[...])
"""

import argparse
import json
import signal

from agentr1.errors import EXIT_OK

STOPPED_NOTE = "the server answered the requests it had and shut down"
MAX_BODY_BYTES = 64 << 20
"""A larger request body is refused (413) as it arrives, unparsed: the most a request may hold
(``openai_chat.MAX_MESSAGES`` messages of ``MAX_CONTENT_CHARS`` characters, each at most 6 bytes as
a JSON escape: ~37 MiB, plus tools) is less."""


def make_app(completions):  # annotations evaluated here: FastAPI reads them (no __future__ import)
    """The FastAPI app over a :class:`agentr1.openai_chat.ChatCompletions`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    from agentr1.openai_chat import ChatRequestError, stream_chunks

    app = FastAPI(title="agentr1", description="the trained agent's policy, OpenAI chat-completions protocol")

    def error(message: str, status: int = 400, param: str | None = None, code: str | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                       "code": code}}, status_code=status)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model": completions.model_name}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": completions.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentr1"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        raw = bytearray()
        async for chunk in request.stream():  # read no further than a request the model could answer
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return error(f"the request body is over {MAX_BODY_BYTES} bytes", 413)
        try:
            body = json.loads(bytes(raw))
        except ValueError as err:  # not JSON, not UTF-8, or an integer over Python's 4,300-digit limit
            return error(f"the request body is not JSON ({err})")
        except RecursionError:
            return error("the request body is nested too deeply")
        asked = body.get("model") if isinstance(body, dict) else None
        if asked is not None and asked != completions.model_name:  # as OpenAI answers an unknown model id
            return error(f"The model `{asked}` does not exist; this server serves `{completions.model_name}` "
                         "(agentr1 serve --name)", 404, "model", "model_not_found")
        try:  # generation holds the CPU for a while: off the event loop, one request at a time
            completion = await run_in_threadpool(completions.create, body)
        except ChatRequestError as err:
            return error(str(err))
        if isinstance(body, dict) and body.get("stream") is True:
            events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in stream_chunks(completion)]
            return StreamingResponse(iter([*events, "data: [DONE]\n\n"]), media_type="text/event-stream")
        return completion

    return app


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agentr1.openai_chat import ChatCompletions
    from cli.console import quiet_third_party, setup_logging
    from cli.agents import load_agent

    setup_logging()
    quiet_third_party()
    label, agent = load_agent(args)  # a model it cannot find: a UserError, the CLI's one-line error
    app = make_app(ChatCompletions(agent, args.name))
    print(f"serving {label} as model {args.name!r}: http://{args.host}:{args.port}/v1 (OpenAI chat completions)",
          flush=True)
    # uvicorn's Server shuts down gracefully on SIGTERM/SIGINT, then puts the handlers it found
    # back and raises the signal again: these handlers turn it into the CLI's stop (one line, 128 +
    # the signal), whatever disposition the process inherited. (`uvicorn.run` would swallow it.)
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return EXIT_OK


def _stop(signum: int, frame) -> None:
    from cli.flows import Stopped

    raise Stopped(signum)


def add_serve(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the trained policy as an OpenAI-compatible chat-completions endpoint")
    p.add_argument("--model", default="champion",
                   help="a registered version or alias, a logged MLflow model dir, or a policy dir (default: champion)")
    p.add_argument("--config", default="conf/train.yaml", help="a policy dir's run config (default: conf/train.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--corpus", default=None, help="the corpus the agent's search tool reads (default: the run's)")
    p.add_argument("--name", default="agentr1", help="the model id clients send (default: agentr1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=cmd_serve, stopped_note=STOPPED_NOTE)
