"""A scripted local model server for the OpenAI chat completions API, as aider (through
litellm and the ``openai`` SDK) calls it.

It answers ``POST /v1/chat/completions`` (a JSON body, or an SSE stream of
``chat.completion.chunk`` objects ending in ``data: [DONE]`` when the request says
``"stream": true``) and ``GET /v1/models``, on 127.0.0.1 and a free port, in a thread of the
test process. Every request is recorded (:attr:`ChatServer.requests`).

What it answers is its **script**, a list of :class:`Reply` played in order (the last one
repeats):

* :data:`STEP` does the step the prompt names: it reads the plan file the prompt points to,
  answers a build.implement with an aider SEARCH/REPLACE block that creates ``src/<item>.txt``
  (what vibey's scripted engine writes) and every kind with its result as a fenced ``json``
  block at the end of the message; a request that names no plan (aider's reflection after a
  failed edit, say) gets ``{"status": "done"}`` alone;
* :func:`error` replies the provider's real error: :data:`RATE_LIMIT` (429
  ``rate_limit_exceeded`` with "Please try again in 20s" and the ``x-ratelimit-reset-*``
  headers), :data:`RATE_LIMIT_NO_RESET` (429 with no time), :data:`QUOTA` (429
  ``insufficient_quota``), :data:`BAD_KEY` (401 ``invalid_api_key``). The bodies are the ones
  api.openai.com sends (``{"error": {"message", "type", "param", "code"}}``), as quoted in the
  issues of the projects that met them (Aider-AI/aider#1686, OpenHands#998, langchainjs#1929).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "vibey-test-model"
PROMPT_TOKENS, COMPLETION_TOKENS = 1234, 56


@dataclass(frozen=True)
class Reply:
    """One answer: a status, headers and a JSON error body, or (status 200) a message
    computed from the request by ``content``."""

    status: int = 200
    body: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content: Callable[[Mapping[str, Any]], str] | None = None


def error(status: int, message: str, kind: str, code: str | None, **headers: str) -> Reply:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Reply(status=status, body=body, headers=headers)


RATE_LIMIT_MESSAGE = (
    f"Rate limit reached for {MODEL} in organization org-vibeytest on requests per min (RPM): "
    "Limit 3, Used 3, Requested 1. Please try again in 20s. Visit "
    "https://platform.openai.com/account/rate-limits to learn more. You can increase your rate "
    "limit by adding a payment method to your account at "
    "https://platform.openai.com/account/billing."
)
RATE_LIMIT = error(
    429,
    RATE_LIMIT_MESSAGE,
    "requests",
    "rate_limit_exceeded",
    **{
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "20s",
        "retry-after": "20",
    },
)
RATE_LIMIT_NO_RESET = error(
    429,
    f"Rate limit reached for {MODEL} in organization org-vibeytest on tokens per min (TPM).",
    "tokens",
    "rate_limit_exceeded",
)
QUOTA = error(
    429,
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, read the docs: "
    "https://platform.openai.com/docs/guides/error-codes/api-errors.",
    "insufficient_quota",
    "insufficient_quota",
)
BAD_KEY = error(
    401,
    "Incorrect API key provided: sk-vibey*****-key. You can find your API key at "
    "https://platform.openai.com/account/api-keys.",
    "invalid_request_error",
    "invalid_api_key",
)


# -- doing the step ------------------------------------------------------------------------


def plan_named(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The plan the last user message that names one points to (``…/.vibey/plans/….json``)."""
    from tests.agents.fake_cli import plan_of

    for message in reversed(messages):
        text = _text(message.get("content"))
        if message.get("role") == "user" and "/.vibey/plans/" in text:
            try:
                return plan_of(text)
            except (SystemExit, OSError, ValueError):
                return None
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def step_files(plan: Mapping[str, Any]) -> dict[str, str]:
    """What the step writes: build.implement's ``src/<item>.txt``, as the scripted engine."""
    item = plan.get("input", {}).get("item")
    if plan.get("kind") != "build.implement" or not isinstance(item, Mapping):
        return {}
    title = str(item.get("title", item["id"]))
    return {f"src/{item['id']}.txt": f"{title}\ncycle {plan['cycle']}\n"}


def step_result(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The step's result: the scripted engine's, for every kind (build.implement's is
    ``done`` for its item, its files come as edits)."""
    if plan.get("kind") == "build.implement":
        return {"status": "done", "item": plan["input"]["item"]["id"]}
    from tests.agents.fake_cli import work

    result, _ = work(dict(plan))
    return result


def search_replace(path: str, text: str) -> str:
    """An aider ``diff`` edit that creates ``path`` with ``text`` (an empty SEARCH)."""
    return f"{path}\n```\n<<<<<<< SEARCH\n=======\n{text.rstrip()}\n>>>>>>> REPLACE\n```\n"


def do_step(request: Mapping[str, Any]) -> str:
    plan = plan_named(request.get("messages", []))
    if plan is None:
        return 'Nothing left to change.\n\n```json\n{"status": "done"}\n```\n'
    edits = "".join(search_replace(p, t) for p, t in step_files(plan).items())
    result = json.dumps(step_result(plan))
    intro = "I will make the change.\n\n" if edits else ""
    return f"{intro}{edits}\nThe step's result:\n\n```json\n{result}\n```\n"


STEP = Reply(content=do_step)


# -- the server ----------------------------------------------------------------------------


class ChatServer:
    """The app on a free port of 127.0.0.1, served from a daemon thread while in a ``with``."""

    def __init__(self, script: Sequence[Reply] = (STEP,)) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.port = _free_port()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="openai-chat", daemon=True)

    @property
    def base_url(self) -> str:
        """What ``OPENAI_API_BASE`` is set to."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the chat completions server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def chats(self) -> list[dict[str, Any]]:
        """The chat completion requests received, in order."""
        with self._lock:
            return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    def _next(self) -> Reply:
        with self._lock:
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    async def _models(self, request: Request) -> Response:
        with self._lock:
            self.requests.append({"path": request.url.path, "headers": dict(request.headers)})
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "vibey"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        with self._lock:
            self.requests.append(
                {"path": request.url.path, "headers": dict(request.headers), "body": body}
            )
        reply = self._next()
        if reply.status != 200 or reply.content is None:
            return JSONResponse(dict(reply.body or {}), reply.status, headers=dict(reply.headers))
        content = await asyncio.to_thread(reply.content, body)
        model = str(body.get("model", MODEL))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_chunks(model, content, usage), media_type="text/event-stream")
        return JSONResponse(_completion(model, content))


def _usage() -> dict[str, int]:
    total = PROMPT_TOKENS + COMPLETION_TOKENS
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": total,
    }


def _completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-vibey",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(),
        "system_fingerprint": "fp_vibey",
    }


async def _chunks(model: str, content: str, usage: bool) -> Any:
    head = {"id": "chatcmpl-vibey", "object": "chat.completion.chunk", "created": 0}
    head["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"

    yield chunk({"role": "assistant", "content": ""}, None)
    for start in range(0, len(content), 40):
        yield chunk({"content": content[start : start + 40]}, None)
    yield chunk({}, "stop")
    if usage:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage()})}\n\n"
    yield "data: [DONE]\n\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
