"""A test server: the OpenAI stand-in server with fault injection, for the client tests.

:class:`ChatTestServer` is :class:`policy.openai_stand_in.OpenAIStandInServer` (the OpenAI chat-completions
protocol over real HTTP on 127.0.0.1 around any :class:`engine.agent.model_api.LanguageModel`: ``data:`` and
``file://`` image URLs, log-probs in the OpenAI shape, token ids as vLLM returns them, the reasoning parser, the
in-flight counts) plus what the tests of the clients' retry paths need (:class:`FaultInjectingServer`):
:meth:`~FaultInjectingServer.fail_next` (an HTTP status, e.g. 429 with Retry-After or 500, for the next N
requests), :meth:`~FaultInjectingServer.delay_next` (answer late, to trigger client timeouts),
:meth:`~FaultInjectingServer.drop_next` (abort the connection without an answer), a fixed ``latency_s`` for every
request, and :meth:`~FaultInjectingServer.kill` / :meth:`~FaultInjectingServer.restart` (the server dies mid-run,
every connection reset, and comes back on the same port). Faults queue up in order; each request takes the next
one. Every request received is recorded in :attr:`~FaultInjectingServer.received` for assertions on the payload.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engine.agent.model_api import LanguageModel
from policy.openai_stand_in import OpenAIStandInServer, error_response


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


class FaultInjectingServer(OpenAIStandInServer):
    """A stand-in server that records every request and answers with the faults queued for it.

    A base for the test servers (the chat one here, the served-model one in tests/served_model_server.py): it
    passes its constructor's arguments on unchanged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latency_s = 0.0  # added to every request (to build up concurrency in tests)
        self.received: list[Received] = []
        self._faults: deque[_Fault] = deque()

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def kill(self) -> None:
        """Die abruptly: stop listening and reset every open connection (in-flight requests get no answer)."""
        runner = self._runner
        if runner is None:
            return
        server = runner.server
        if server is not None:
            for conn in server.connections:
                if conn.transport is not None:
                    conn.transport.abort()  # RST, not a graceful close: the process died
        await super().stop()

    async def restart(self) -> None:
        """Start again on the same port after :meth:`kill`."""
        await self.kill()
        await self.start()

    async def stop(self) -> None:
        """Shut down (same as :meth:`kill`; tests do not need a graceful drain)."""
        await self.kill()

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

    async def intercept(self, request: web.Request, payload: dict[str, Any]) -> web.StreamResponse | None:
        """Record the request, wait ``latency_s``, then apply the next fault (if any)."""
        self.received.append(Received(payload=payload, headers=dict(request.headers)))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        fault = self._faults.popleft() if self._faults else None
        if fault is None:
            return None
        if fault.kind == "status":
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else None
            return error_response(fault.status, fault.message, headers)
        if fault.kind == "drop":
            if request.transport is not None:
                request.transport.abort()
            await asyncio.sleep(3600)  # cancelled by handler_cancellation once the connection is gone
        if fault.kind == "delay":
            await asyncio.sleep(fault.delay_s)
        return None


class ChatTestServer(FaultInjectingServer):
    """A test server (a stand-in for a vLLM server) around ``model``; ``async with`` starts and stops it.

    ``reasoning_parser=True`` moves a leading ``<think>...</think>`` of the model's text into
    ``message.reasoning_content``, as vLLM's reasoning parsers do. ``allowed_media_dir`` enables ``file://``
    image URLs under that directory (like vLLM's ``--allowed-local-media-path``).
    """

    def __init__(self, model: LanguageModel, served_model_name: str = "test-model", **kwargs: Any) -> None:
        super().__init__(model, served_model_name, **kwargs)
