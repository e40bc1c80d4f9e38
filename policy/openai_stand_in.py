"""An OpenAI chat-completions server around any language model: a stand-in for vLLM or SGLang without a GPU.

vLLM and SGLang need a GPU. :class:`OpenAIStandInServer` serves a small in-process
:class:`engine.agent.model_api.LanguageModel` over real HTTP (aiohttp.web on 127.0.0.1, a random port by default) with
the same chat-completions protocol, so the clients (``policy.openai_backend.OpenAIModel``, the judge, the RL
loop) run unchanged on CPU runs, demos and tests. It is not a production inference server: no batching of its
own, no streaming, no tokenizer.

What it speaks:

- ``POST /v1/chat/completions``: ``image_url`` parts are turned back into JPEG bytes and our image parts
  (``data:`` URLs, or ``file://`` URLs under ``allowed_media_dir``, like vLLM's ``--allowed-local-media-path``);
  the reply has the OpenAI shape (``choices[0].message``, ``logprobs.content``, ``finish_reason``, ``usage``).
  Token strings in the log-probs are ``"token_id:N"`` when the request asks for ``return_tokens_as_token_ids``
  (as vLLM returns them), else ``"<N>"``; ``return_token_ids`` adds ``choices[0].token_ids`` (vLLM's and
  SGLang's field). ``reasoning_parser=True`` moves a leading ``<think>...</think>`` into
  ``message.reasoning_content``, as vLLM's reasoning parsers do. Errors have vLLM's shape
  (:func:`error_response`).
- ``GET /v1/models``: the one served model name.

It counts the requests in flight (:attr:`OpenAIStandInServer.in_flight`, ``max_in_flight_seen``) and the replies
sent (``completed``). Subclasses add endpoints (:meth:`OpenAIStandInServer.add_routes`), hold or abort
generations (:meth:`OpenAIStandInServer.generate`), add reply fields (:meth:`OpenAIStandInServer.reply_fields`)
or answer a request before it reaches the model (:meth:`OpenAIStandInServer.intercept`).
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from pathlib import Path
from typing import Any, Self
from urllib.parse import unquote, urlparse

from aiohttp import web

from engine.agent.model_api import ChatRequest, Generation, LanguageModel, SamplingParams

_DATA_URL_PREFIX = "data:image/jpeg;base64,"


class BadRequest(Exception):
    """A request the real servers would refuse with HTTP 400."""


class OpenAIStandInServer:
    """The OpenAI chat-completions protocol over HTTP around ``model`` (see the module docstring).

    ``async with`` (or :meth:`start` / :meth:`stop`) listens and stops; the model's own lifecycle stays with
    the caller. ``port=0`` takes a free port, kept across a stop and start; :attr:`base_url` is the API root.
    """

    def __init__(self, model: LanguageModel, served_model_name: str = "model", *, host: str = "127.0.0.1",
                 port: int = 0, reasoning_parser: bool = False,
                 allowed_media_dir: str | Path | None = None) -> None:
        self.model = model
        self.served_model_name = served_model_name
        self.host = host
        self.port = port
        self.reasoning_parser = reasoning_parser
        self.allowed_media_dir = Path(allowed_media_dir).resolve() if allowed_media_dir is not None else None
        self.in_flight = 0
        self.max_in_flight_seen = 0
        self.completed = 0  # 200 replies sent
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The API root, as an OpenAI client wants it: ``http://HOST:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Listen on ``host`` (a free port the first time when ``port`` is 0, the same one after a restart)."""
        app = web.Application(client_max_size=256 * 1024 * 1024)  # screenshots in data: URLs
        self.add_routes(app)
        # handler_cancellation: a client that hangs up cancels its request, as in vLLM; a tiny
        # shutdown_timeout so stopping does not wait for handlers (0 would mean "no timeout" in aiohttp).
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.01, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        if self.port == 0:
            self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop listening; requests still in flight are cancelled."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- hooks for subclasses ----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        """The server's endpoints (subclasses add theirs)."""
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)

    async def intercept(self, request: web.Request, payload: dict[str, Any]) -> web.StreamResponse | None:
        """A response to send instead of the model's, or None to go on (the default)."""
        return None

    async def generate(self, chat: ChatRequest) -> Generation:
        """The model's reply to one request (subclasses hold or abort it)."""
        return await self.model.generate(chat)

    def reply_fields(self, gen: Generation) -> dict[str, Any]:
        """Extra top-level fields of the reply with ``gen`` (subclasses: the weights' version)."""
        return {}

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
            return error_response(400, "request body is not JSON")
        early = await self.intercept(request, payload)
        if early is not None:
            return early
        try:
            chat = self._to_chat_request(payload)
        except BadRequest as exc:
            return error_response(400, str(exc))
        gen = await self.generate(chat)
        self.completed += 1
        return web.json_response(self._reply(payload, gen))

    def _reply(self, payload: dict[str, Any], gen: Generation) -> dict[str, Any]:
        """The chat-completion body for ``gen``, in the OpenAI shape with vLLM's extensions."""
        text = gen.text
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning_parser and text.startswith("<think>") and "</think>" in text:
            reasoning, _, content = text[len("<think>"):].partition("</think>")
            message = {"role": "assistant", "content": content, "reasoning_content": reasoning}

        logprobs: dict[str, Any] | None = None
        if payload.get("logprobs") and gen.logprobs is not None:
            as_ids = bool(payload.get("return_tokens_as_token_ids"))
            ids = gen.token_ids if gen.token_ids is not None else [None] * len(gen.logprobs)
            # No tokenizer here: a token is named by its id ("<N>" when the client did not ask for ids).
            logprobs = {"content": [
                {"token": (f"token_id:{t}" if as_ids else f"<{t}>"), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(ids, gen.logprobs, strict=True)]}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs,
                                  "finish_reason": gen.finish_reason or "stop"}
        if payload.get("return_token_ids") and gen.token_ids is not None:
            choice["token_ids"] = gen.token_ids  # vLLM's and SGLang's return_token_ids
        completion_tokens = len(gen.token_ids) if gen.token_ids is not None else 0
        prompt_tokens = gen.prompt_tokens or 0
        return {
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.served_model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            **self.reply_fields(gen),
        }

    def _to_chat_request(self, payload: dict[str, Any]) -> ChatRequest:
        """Our ChatRequest from an OpenAI payload (BadRequest on what vLLM would refuse)."""
        if payload.get("model") != self.served_model_name:
            raise BadRequest(f"The model `{payload.get('model')}` does not exist.")
        messages_in = payload.get("messages")
        if not isinstance(messages_in, list) or not messages_in:
            raise BadRequest("messages must be a non-empty list")
        max_tokens = payload.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
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
        return ChatRequest(request_id=f"stand-in-{next(self._ids)}", messages=messages, images=images,
                           sampling=sampling)

    def _image_bytes(self, url: str) -> bytes:
        if url.startswith(_DATA_URL_PREFIX):
            try:
                return base64.b64decode(url[len(_DATA_URL_PREFIX):], validate=True)
            except ValueError as exc:
                raise BadRequest(f"bad data URL: {exc}") from None
        if url.startswith("file://"):
            path = Path(unquote(urlparse(url).path)).resolve()
            if self.allowed_media_dir is None or not path.is_relative_to(self.allowed_media_dir):
                raise BadRequest("Cannot load local files without `--allowed-local-media-path`.")
            try:
                return path.read_bytes()
            except OSError as exc:
                raise BadRequest(f"cannot read {path}: {exc}") from None
        raise BadRequest(f"unsupported image URL {url[:40]!r}")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """An error in vLLM's shape (``{"error": {"message", "type", "param", "code"}}``)."""
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status, headers=headers)
