"""A test server: a stand-in for a vLLM server in tests.

:class:`ChatTestServer` speaks the OpenAI chat-completions protocol over real HTTP on 127.0.0.1 (aiohttp.web,
a random port) around any :class:`engine.model_api.LanguageModel`: it turns ``image_url`` parts (``data:`` URLs,
or ``file://`` URLs like vLLM's ``--allowed-local-media-path``) back into JPEG bytes and our image parts,
calls ``model.generate`` and answers in the OpenAI shape (``choices[0].message``, ``logprobs.content``,
``finish_reason``, ``usage``). Token strings in the logprobs are ``"token_id:N"`` when the request asks
for ``return_tokens_as_token_ids`` (as vLLM does), else ``"<N>"`` (the test server has no tokenizer).

Fault injection, for the client's retry paths: :meth:`ChatTestServer.fail_next` (an HTTP status, e.g. 429
with Retry-After or 500, for the next N requests), :meth:`ChatTestServer.delay_next` (answer late, to
trigger client timeouts), :meth:`ChatTestServer.drop_next` (abort the connection without an answer), a
fixed ``latency_s`` for every request, and :meth:`ChatTestServer.kill` / :meth:`ChatTestServer.restart`
(the server dies mid-run, every connection reset, and comes back on the same port). Faults queue up in
order; each request takes the next one. Every request received is recorded in
:attr:`ChatTestServer.received` for assertions on the payload.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from aiohttp import web

from engine.model_api import ChatRequest, Generation, LanguageModel, SamplingParams

_DATA_URL_PREFIX = "data:image/jpeg;base64,"


@dataclass(slots=True)
class Received:
    """One request as the test server got it."""

    payload: dict[str, Any]
    headers: dict[str, str]
    t: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Fault:
    kind: str  # "status" | "delay" | "drop"
    status: int = 500
    message: str = ""
    retry_after: float | None = None
    delay_s: float = 0.0


class _BadRequest(Exception):
    pass


class ChatTestServer:
    """A test server (a stand-in for a vLLM server) around ``model``; ``async with`` starts and stops it.

    ``reasoning_parser=True`` moves a leading ``<think>...</think>`` of the model's text into
    ``message.reasoning_content``, as vLLM's reasoning parsers do. ``allowed_media_dir`` enables ``file://``
    image URLs under that directory (like vLLM's ``--allowed-local-media-path``).
    """

    def __init__(self, model: LanguageModel, served_model_name: str = "test-model", *, port: int = 0,
                 reasoning_parser: bool = False, allowed_media_dir: str | Path | None = None) -> None:
        self.model = model
        self.served_model_name = served_model_name
        self.port = port
        self.reasoning_parser = reasoning_parser
        self.allowed_media_dir = Path(allowed_media_dir).resolve() if allowed_media_dir is not None else None
        self.latency_s = 0.0  # added to every request (to build up concurrency in tests)
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight_seen = 0
        self.completed = 0  # 200 replies sent
        self._faults: deque[_Fault] = deque()
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The API root, as an OpenAI client wants it: ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (a random port the first time, the same port on a restart)."""
        app = web.Application(client_max_size=256 * 1024 * 1024)
        self.add_routes(app)
        # handler_cancellation: a client that hangs up cancels its request, as in vLLM; a tiny
        # shutdown_timeout so kill() does not wait for handlers (0 would mean "no timeout" in aiohttp).
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.01, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        if self.port == 0:
            self.port = runner.addresses[0][1]

    async def kill(self) -> None:
        """Die abruptly: stop listening and reset every open connection (in-flight requests get no answer)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        server = runner.server
        if server is not None:
            for conn in server.connections:
                if conn.transport is not None:
                    conn.transport.abort()  # RST, not a graceful close: the process died
        await runner.cleanup()

    async def restart(self) -> None:
        """Start again on the same port after :meth:`kill`."""
        await self.kill()
        await self.start()

    async def stop(self) -> None:
        """Shut down (same as :meth:`kill`; tests do not need a graceful drain)."""
        await self.kill()

    async def __aenter__(self) -> ChatTestServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def add_routes(self, app: web.Application) -> None:
        """The server's endpoints (subclasses add theirs)."""
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)

    async def generate(self, chat: ChatRequest) -> Generation:
        """The model's reply to one request (subclasses hold or abort it)."""
        return await self.model.generate(chat)

    def reply_fields(self, gen: Generation) -> dict[str, Any]:
        """Extra top-level fields of the reply with ``gen`` (subclasses: the weights' version)."""
        return {}

    # -- fault injection -----------------------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500, *, retry_after: float | None = None,
                  message: str | None = None) -> None:
        """Answer the next ``n`` requests with HTTP ``status`` (and a ``Retry-After`` header if given)."""
        msg = message if message is not None else f"injected HTTP {status}"
        self._faults.extend(_Fault("status", status=status, message=msg, retry_after=retry_after) for _ in range(n))

    def delay_next(self, n: int, seconds: float) -> None:
        """Answer the next ``n`` requests only after ``seconds`` (to trigger client timeouts)."""
        self._faults.extend(_Fault("delay", delay_s=seconds) for _ in range(n))

    def drop_next(self, n: int) -> None:
        """Abort the connection of the next ``n`` requests without answering."""
        self._faults.extend(_Fault("drop") for _ in range(n))

    def clear_faults(self) -> None:
        """Forget the faults not yet used."""
        self._faults.clear()

    # -- handlers --------------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model_name, "object": "model"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)
        try:
            return await self._serve(request)
        finally:
            self.in_flight -= 1

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            payload = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not JSON")
        self.received.append(Received(payload=payload, headers=dict(request.headers)))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

        fault = self._faults.popleft() if self._faults else None
        if fault is not None:
            if fault.kind == "status":
                headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else None
                return _error(fault.status, fault.message, headers)
            if fault.kind == "drop":
                if request.transport is not None:
                    request.transport.abort()
                await asyncio.sleep(3600)  # cancelled by handler_cancellation once the connection is gone
            if fault.kind == "delay":
                await asyncio.sleep(fault.delay_s)

        try:
            chat = self._to_chat_request(payload)
        except _BadRequest as exc:
            return _error(400, str(exc))
        gen = await self.generate(chat)

        text = gen.text
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning_parser and text.startswith("<think>") and "</think>" in text:
            reasoning, _, content = text[len("<think>"):].partition("</think>")
            message = {"role": "assistant", "content": content, "reasoning_content": reasoning}

        logprobs: dict[str, Any] | None = None
        if payload.get("logprobs") and gen.logprobs is not None:
            as_ids = bool(payload.get("return_tokens_as_token_ids"))
            ids = gen.token_ids if gen.token_ids is not None else [None] * len(gen.logprobs)
            logprobs = {"content": [
                {"token": (f"token_id:{t}" if as_ids else f"<{t}>"), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(ids, gen.logprobs, strict=True)]}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs,
                                  "finish_reason": gen.finish_reason or "stop"}
        if payload.get("return_token_ids") and gen.token_ids is not None:
            choice["token_ids"] = gen.token_ids  # vLLM's and SGLang's return_token_ids
        completion_tokens = len(gen.token_ids) if gen.token_ids is not None else 0
        prompt_tokens = gen.prompt_tokens or 0
        self.completed += 1
        return web.json_response({
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.served_model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            **self.reply_fields(gen),
        })

    def _to_chat_request(self, payload: dict[str, Any]) -> ChatRequest:
        """Our ChatRequest from an OpenAI payload (400 on what vLLM would refuse)."""
        if payload.get("model") != self.served_model_name:
            raise _BadRequest(f"The model `{payload.get('model')}` does not exist.")
        messages_in = payload.get("messages")
        if not isinstance(messages_in, list) or not messages_in:
            raise _BadRequest("messages must be a non-empty list")
        max_tokens = payload.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        images: dict[str, bytes] = {}
        messages: list[dict[str, Any]] = []
        for message in messages_in:
            content = message.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if part.get("type") == "image_url":
                        ref = f"image_{len(images)}.jpg"
                        images[ref] = self._image_bytes(part["image_url"]["url"])
                        parts.append({"type": "image", "image": ref})
                    else:
                        parts.append(part)
                message = {**message, "content": parts}
            messages.append(message)
        sampling = SamplingParams(temperature=payload.get("temperature", 1.0), top_p=payload.get("top_p", 1.0),
                                  top_k=payload.get("top_k"), max_tokens=max_tokens, seed=payload.get("seed"),
                                  logprobs=bool(payload.get("logprobs")))
        return ChatRequest(request_id=f"test-server-{next(self._ids)}", messages=messages, images=images,
                           sampling=sampling)

    def _image_bytes(self, url: str) -> bytes:
        if url.startswith(_DATA_URL_PREFIX):
            try:
                return base64.b64decode(url[len(_DATA_URL_PREFIX):], validate=True)
            except ValueError as exc:
                raise _BadRequest(f"bad data URL: {exc}") from None
        if url.startswith("file://"):
            path = Path(unquote(urlparse(url).path)).resolve()
            if self.allowed_media_dir is None or not path.is_relative_to(self.allowed_media_dir):
                raise _BadRequest("Cannot load local files without `--allowed-local-media-path`.")
            try:
                return path.read_bytes()
            except OSError as exc:
                raise _BadRequest(f"cannot read {path}: {exc}") from None
        raise _BadRequest(f"unsupported image URL {url[:40]!r}")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """An error in vLLM's shape (``{"error": {"message", "type", "code"}}``)."""
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status, headers=headers)
