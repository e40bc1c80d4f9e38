"""The ``openai`` backend: any OpenAI-compatible chat-completions server (vLLM, SGLang).

One :class:`OpenAIModel` holds one aiohttp session with a connection pool and caps the requests in
flight with a semaphore, so hundreds of rollouts can call :meth:`OpenAIModel.generate` at once.
Transient failures (HTTP 429 and 5xx, refused or dropped connections, per-request timeouts) are retried
with capped exponential backoff and jitter; other client errors fail at once with the server's message.

Payload (``POST {base_url}/chat/completions``)::

    {"model": MODEL,
     "messages": [{"role": ..., "content": [{"type": "text", "text": ...},
                                             {"type": "image_url", "image_url": {"url": URL}}, ...]}, ...],
     "temperature": T, "top_p": P, "max_tokens": N,
     "seed": S,                       # only when sampling.seed is set
     "top_k": K,                      # only when sampling.top_k is set (vLLM and SGLang take it top-level)
     "logprobs": true, "top_logprobs": 0,       # when sampling.logprobs (or token_ids=True)
     "return_tokens_as_token_ids": true,        # only with token_ids=True (vLLM)
     **extra_body}

``URL`` is ``data:image/jpeg;base64,...`` built from the request's JPEG bytes (``image_transport=
"data_url"``, the default), or ``file://{run_dir}/{REF}`` (``image_transport="file_url"``) for a vLLM
server on the same host started with ``--allowed-local-media-path`` covering the run directory; that
saves base64-encoding and parsing screenshots on both sides.

Token ids: chat completions do not return the generated token ids. With ``token_ids=True`` the backend
asks vLLM for ``return_tokens_as_token_ids``, which makes every logprobs entry's ``token`` a
``"token_id:123"`` string; those are parsed into :attr:`Generation.token_ids` (so logprobs are requested
too). A server that returns ``choices[0].token_ids`` (vLLM's ``return_token_ids``, via ``extra_body``)
is read as well. Servers other than vLLM may reject or ignore the flag.

Log-probabilities: ``logprobs_of`` declares what the server reports (:attr:`Generation.logprobs_of`): ``"model"``
for vLLM's default (``--logprobs-mode raw_logprobs``) and SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``,
``"temperature"`` for SGLang's default (``log_softmax(logits / T)`` before top-k and top-p), ``"sampler"`` for a
server that reports them after truncation; None when unknown (the trainer then refuses GRPO on them).

Policy versions and weight pushes: every reply carries the version of the weights that produced it
(:attr:`Generation.policy_version`): the server's own label where the reply has one (SGLang's
``metadata.weight_version``), else the version this client last set with :meth:`OpenAIModel.release`. Around a
weight push (:mod:`policy.weight_sync`) :meth:`OpenAIModel.hold` stops new requests from being sent and either
waits for the ones in flight to finish on the old weights (``drain=True``) or marks them to be sent again once
the push is over (``drain=False``: the server aborts them), so no accepted reply spans two versions.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import aiohttp

from engine import json_input
from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.agent.policy_api import PolicyError

ImageTransport = Literal["data_url", "file_url"]

_TOKEN_ID_PREFIX = "token_id:"
_ERROR_BODY_CHARS = 500  # how much of a non-JSON error body goes into a PolicyError


class _Retryable(Exception):
    """One attempt failed in a way worth retrying; ``delay_s`` is the server's Retry-After, if any."""

    def __init__(self, cause: str, delay_s: float | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.delay_s = delay_s


class OpenAIModel(LanguageModel):
    """A LanguageModel backed by an OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` is the API root, e.g. ``http://host:8000/v1``; ``model`` the served model name.
    ``max_in_flight`` caps concurrent HTTP requests (and sizes the connection pool); ``timeout_s`` is the
    total time allowed for one attempt; ``retries`` the extra attempts after the first on a transient
    failure, waiting ``backoff_s * 2**k`` (capped at ``backoff_max_s``, with jitter) between them.
    ``extra_body`` is merged into every payload last (it may override any field). ``max_reply_bytes`` caps one
    reply's body (a reply is a few kB, tens with logprobs): a server that sends more fails the call rather than
    the engine's memory. See the module docstring for ``image_transport``, ``run_dir`` and ``token_ids``.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str | None = None, max_in_flight: int = 128,
                 timeout_s: float = 120.0, retries: int = 4, backoff_s: float = 0.5, backoff_max_s: float = 8.0,
                 image_transport: ImageTransport = "data_url", run_dir: str | Path | None = None,
                 extra_body: Mapping[str, Any] | None = None, token_ids: bool = False,
                 logprobs_of: str | None = None, max_reply_bytes: int = 64 << 20) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if image_transport not in ("data_url", "file_url"):
            raise ValueError(f"image_transport must be 'data_url' or 'file_url', not {image_transport!r}")
        if image_transport == "file_url" and run_dir is None:
            raise ValueError("image_transport='file_url' needs run_dir (the directory image REFs are relative to)")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model_name = model
        self.api_key = api_key
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.image_transport = image_transport
        # Resolved once: the server needs absolute paths, and --allowed-local-media-path compares prefixes.
        self.run_dir = Path(run_dir).resolve() if run_dir is not None else None
        self.extra_body = dict(extra_body or {})
        self.token_ids = token_ids
        self.logprobs_of = logprobs_of
        self.max_reply_bytes = max_reply_bytes
        self.version: int | None = None  # the served weights' version, as set by release()
        self._open = asyncio.Event()  # cleared by hold(): no request is sent during a weight push
        self._refused: str | None = None  # set by refuse(): why no request is sent any more
        self._open.set()
        self._epoch = 0  # hold() count: a request remembers the epoch it was sent in
        self._resend_before = 0  # a request sent in an earlier epoch than this is sent again (abort mode)
        self._in_flight = 0
        self._idle = asyncio.Event()  # set while no request is in flight (hold(drain=True) waits on it)
        self._idle.set()
        self.resent = 0  # requests sent again because a weight push aborted them
        self._session: aiohttp.ClientSession | None = None
        self._semaphore = asyncio.Semaphore(max_in_flight)
        self._closed = False
        self._pending: set[asyncio.Task[Any]] = set()  # tasks inside generate(), cancelled by close()
        self._cancelled_by_close: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the HTTP session (one connection pool of ``max_in_flight`` connections)."""
        if self._closed:
            raise PolicyError("OpenAIModel is closed")
        if self._session is not None:
            return
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        self._session = aiohttp.ClientSession(connector=connector, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        """Close the session; pending and later generate() calls raise PolicyError."""
        self._closed = True
        # Cancel the callers' tasks where they wait (semaphore, HTTP, backoff); generate() turns this
        # cancellation, and only this one, into a PolicyError.
        for task in list(self._pending):
            if not task.done():
                self._cancelled_by_close.add(task)
                task.cancel()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- weight pushes -----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet."""
        return self._in_flight

    async def hold(self, drain: bool) -> int:
        """Stop sending requests (until :meth:`release`); returns how many were in flight.

        ``drain=True``: wait until those have their replies (they finish on the old weights and are recorded so).
        ``drain=False``: return at once; their replies, whatever they are (the server aborts them), are thrown
        away and the requests sent again after the push, on the new weights.
        """
        self._open.clear()
        self._epoch += 1
        in_flight = self._in_flight
        if drain:
            await self._idle.wait()
        else:
            self._resend_before = self._epoch
        return in_flight

    def release(self, version: int | None) -> None:
        """Send requests again; replies without a version of their own are recorded with ``version``."""
        if version is not None:
            self.version = version
        self._open.set()

    def refuse(self, reason: str) -> None:
        """Send no request from now on: each one, held or new, raises PolicyError(``reason``) (a failed weight
        push left the server's weights of no known version)."""
        self._refused = reason
        self._open.set()

    # -- generation --------------------------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> Generation:
        """One chat completion; raises PolicyError when no reply can be had (see the class docstring)."""
        if self._closed:
            raise PolicyError("OpenAIModel is closed")
        if self._session is None:
            raise PolicyError("OpenAIModel.generate() called before start()")
        task = asyncio.current_task()
        assert task is not None
        self._pending.add(task)
        try:
            return await self._generate(request)
        except asyncio.CancelledError:
            if task in self._cancelled_by_close and task.uncancel() == 0:
                raise PolicyError(f"request {request.request_id}: OpenAIModel closed") from None
            raise  # the caller's own cancellation
        finally:
            self._pending.discard(task)
            self._cancelled_by_close.discard(task)

    async def _generate(self, request: ChatRequest) -> Generation:
        # Serialised once: retries resend the same bytes.
        body = json.dumps(self.build_payload(request), separators=(",", ":")).encode()
        t_start = time.perf_counter()
        cause = ""
        attempt = 0
        while attempt <= self.retries:
            attempt += 1
            if self._session is None:  # closed between attempts
                raise PolicyError(f"request {request.request_id}: OpenAIModel closed")
            await self._open.wait()
            if self._refused is not None:
                raise PolicyError(f"request {request.request_id}: {self._refused}")
            epoch, version = self._epoch, self.version
            try:
                async with self._semaphore:
                    t_http = time.perf_counter()
                    self._sent()
                    try:
                        data = await self._post(body, request.request_id)
                    finally:
                        self._answered()
                    http_ms = (time.perf_counter() - t_http) * 1000.0
            except (_Retryable, PolicyError) as exc:
                if epoch < self._resend_before:  # aborted by a weight push: not the request's fault
                    attempt -= 1
                    self.resent += 1
                    continue
                if isinstance(exc, PolicyError):
                    raise
                cause = exc.cause
                if attempt > self.retries:
                    break
                await asyncio.sleep(self._backoff(attempt, exc.delay_s))
                continue
            if epoch < self._resend_before:  # a reply from before a push that aborted it: send it again
                attempt -= 1
                self.resent += 1
                continue
            gen = self.parse_response(data, request.request_id)
            if gen.policy_version is None:
                gen.policy_version = version
            gen.timings_ms = {"http_ms": http_ms, "attempts": attempt,
                              "total_ms": (time.perf_counter() - t_start) * 1000.0}
            return gen
        raise PolicyError(f"request {request.request_id}: {self.url} gave no reply after {self.retries + 1} "
                          f"attempts; last: {cause}")

    def _sent(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _answered(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def _post(self, body: bytes, request_id: str) -> Any:
        """One attempt: the parsed JSON body of a 200 reply; _Retryable or PolicyError otherwise."""
        session = self._session
        if session is None:
            raise PolicyError(f"request {request_id}: OpenAIModel closed")
        try:
            async with session.post(self.url, data=body) as resp:
                raw = await self._read_body(resp, request_id)
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except TimeoutError:
            raise _Retryable(f"timeout after {self.timeout_s:g} s") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ClientError as exc:  # a bad URL and the like: retrying cannot help
            raise PolicyError(f"request {request_id}: {self.url}: {type(exc).__name__}: {exc}") from exc
        if status == 200:
            try:
                return json_input.loads(raw)
            except ValueError as exc:  # also: a number too long, nesting too deep
                raise PolicyError(f"request {request_id}: malformed JSON from {self.url}: {exc}; "
                                  f"body: {raw[:_ERROR_BODY_CHARS]!r}") from None
        message = _error_message(raw)
        if status == 429:
            raise _Retryable(f"HTTP 429: {message}", _parse_retry_after(retry_after))
        if status >= 500:
            raise _Retryable(f"HTTP {status}: {message}")
        raise PolicyError(f"request {request_id}: {self.url} answered HTTP {status}: {message}")

    async def _read_body(self, resp: aiohttp.ClientResponse, request_id: str) -> bytes:
        """The reply's body, refused (PolicyError, no retry: the server would send the same) past
        ``max_reply_bytes``, before it is all read."""
        cap = self.max_reply_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise PolicyError(f"request {request_id}: {self.url} sent a reply of {resp.content_length:,} bytes, over "
                              f"the {cap:,}-byte cap (max_reply_bytes)")
        body = bytearray()
        async for chunk in resp.content.iter_any():
            body += chunk
            if len(body) > cap:
                raise PolicyError(f"request {request_id}: {self.url} sent a reply of over {cap:,} bytes, the cap "
                                  "(max_reply_bytes)")
        return bytes(body)

    def _backoff(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), self.backoff_max_s)
        delay = min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s)
        # "Equal jitter": at least half the delay, so retries still back off, but spread out so the
        # requests that failed together (a server restart) do not all come back in the same instant.
        return delay / 2 + random.uniform(0.0, delay / 2)

    # -- payload and reply ---------------------------------------------------------------------------

    def build_payload(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body for ``request`` (exact shape in the module docstring)."""
        urls: dict[str, str] = {}  # one conversion per REF, even if a screenshot appears twice

        def image_url(ref: str) -> str:
            url = urls.get(ref)
            if url is None:
                if self.image_transport == "file_url":
                    assert self.run_dir is not None
                    url = (self.run_dir / ref).as_uri()
                else:
                    jpeg = request.images.get(ref)
                    if jpeg is None:
                        raise PolicyError(f"request {request.request_id}: no bytes for image {ref!r}")
                    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
                urls[ref] = url
            return url

        messages: list[dict[str, Any]] = []
        for message in request.messages:
            content = message.get("content")
            if isinstance(content, list):
                parts: list[Any] = []
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "image":
                        parts.append({"type": "image_url", "image_url": {"url": image_url(part["image"])}})
                    else:
                        parts.append(part)
                message = {**message, "content": parts}
            messages.append(message)

        sampling = request.sampling
        payload: dict[str, Any] = {"model": self.model_name, "messages": messages,
                                   "temperature": sampling.temperature, "top_p": sampling.top_p,
                                   "max_tokens": sampling.max_tokens}
        if sampling.seed is not None:
            payload["seed"] = sampling.seed
        if sampling.top_k is not None:
            payload["top_k"] = sampling.top_k
        if sampling.logprobs or self.token_ids:  # token ids come inside the logprobs entries
            payload["logprobs"] = True
            payload["top_logprobs"] = 0
        if self.token_ids:
            payload["return_tokens_as_token_ids"] = True
        payload.update(self.extra_body)
        return payload

    def parse_response(self, data: Any, request_id: str = "") -> Generation:
        """A Generation from a chat-completions reply body; PolicyError if it has no usable choice."""
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"request {request_id}: reply from {self.url} has no choices[0].message: "
                              f"{json.dumps(data)[:_ERROR_BODY_CHARS]}") from None
        if not isinstance(message, dict):
            raise PolicyError(f"request {request_id}: reply from {self.url} has a malformed message")
        content = _text(message.get("content"))
        # vLLM/SGLang with a reasoning parser split the thinking off; folding it back keeps the text
        # identical to what the model generated, which the agent parser and training expect.
        reasoning = _text(message.get("reasoning_content") or message.get("reasoning"))
        if content is None or reasoning is None:
            raise PolicyError(f"request {request_id}: reply from {self.url} has a message whose content is not "
                              f"text: {json.dumps(message)[:_ERROR_BODY_CHARS]}")
        text = f"<think>{reasoning}</think>{content}" if reasoning else content

        logprobs: list[float] | None = None
        token_ids: list[int] | None = None
        lp = choice.get("logprobs")
        entries = lp.get("content") if isinstance(lp, dict) else None
        if isinstance(entries, list) and entries:
            try:
                logprobs = [float(e["logprob"]) for e in entries]
            except (KeyError, TypeError, ValueError):
                logprobs = None
            if self.token_ids:
                token_ids = _parse_token_ids(entries)
        raw_ids = choice.get("token_ids")
        if token_ids is None and isinstance(raw_ids, list) and all(isinstance(t, int) for t in raw_ids):
            token_ids = raw_ids

        usage = data.get("usage") if isinstance(data, dict) else None
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        metadata = data.get("metadata") if isinstance(data, dict) else None
        served = _parse_version(metadata.get("weight_version") if isinstance(metadata, dict) else None)
        return Generation(text=text, token_ids=token_ids, logprobs=logprobs,
                          logprobs_of=self.logprobs_of if logprobs is not None else None,
                          prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
                          finish_reason=choice.get("finish_reason"), policy_version=served)


def _text(value: Any) -> str | None:
    """A message field as text: a string, nothing (""), or a list of content parts (the text of its text parts, in
    order, as some servers send it); None for anything else."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        texts = [p.get("text") for p in value if p.get("type") == "text"]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return None


def _parse_version(value: Any) -> int | None:
    """A policy version from a server's weight-version label (this project pushes decimal integers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        try:
            return int(value)
        except ValueError:  # a digit int() does not read ("²"), or more digits than Python converts
            return None
    return None


def _parse_token_ids(entries: list[Any]) -> list[int] | None:
    """Token ids from vLLM's ``"token_id:123"`` logprob tokens; None if any entry is not in that form."""
    ids: list[int] = []
    for entry in entries:
        token = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
            return None
        try:
            ids.append(int(token[len(_TOKEN_ID_PREFIX):]))
        except ValueError:
            return None
    return ids


def _error_message(raw: bytes) -> str:
    """The server's error message: OpenAI's ``{"error": {"message"}}``, vLLM's older ``{"message"}``,
    or the start of the body."""
    try:
        data = json_input.loads(raw)
    except ValueError:
        return raw[:_ERROR_BODY_CHARS].decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if data.get("message"):
            return str(data["message"])
        if data.get("detail"):  # FastAPI's default error shape
            return str(data["detail"])
    return json.dumps(data)[:_ERROR_BODY_CHARS]


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds, fractional accepted, or an HTTP date)."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)
