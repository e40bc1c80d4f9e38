"""The ``openai`` backend (:class:`policy.openai_backend.OpenAIModel`) against a test server over real HTTP.

The test server (:class:`tests.chat_test_server.ChatTestServer`, a stand-in for a vLLM server) wraps
:class:`EchoTestModel`, a deterministic test-only stand-in for a model; one test wraps the real tiny
Qwen3-VL model of :mod:`policy.tiny_models` through :mod:`policy.hf_backend` when those exist.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import io
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from engine.agent.model_api import ChatRequest, Generation, LanguageModel, SamplingParams, image_refs
from engine.agent.policy_api import PolicyError
from policy.openai_backend import OpenAIModel, _parse_retry_after
from tests.chat_test_server import ChatTestServer

pytestmark = pytest.mark.timeout(60)


class EchoTestModel(LanguageModel):
    """A test stand-in for a model: replies ``images=N last=<last text part>`` with fake token ids
    (the characters' code points) and fake logprobs (-0.01 * position), and keeps the requests it got."""

    name = "echo-test"

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    async def generate(self, request: ChatRequest) -> Generation:
        self.requests.append(request)
        refs = image_refs(request.messages)
        texts = [part["text"] for m in request.messages if isinstance(m.get("content"), list)
                 for part in m["content"] if part.get("type") == "text"]
        text = f"images={len(refs)} last={texts[-1] if texts else ''}"
        return Generation(text=text, token_ids=[ord(c) for c in text],
                          logprobs=[-0.01 * (i + 1) for i in range(len(text))],
                          prompt_tokens=100 * len(refs) + sum(len(t) for t in texts), finish_reason="stop")


def make_jpeg(seed: int = 0, size: tuple[int, int] = (64, 48)) -> bytes:
    """A small real JPEG (distinct per seed)."""
    from PIL import Image

    img = Image.new("RGB", size, ((seed * 40) % 256, 120, 200))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def chat_request(request_id: str = "r1", text: str = "click the button", n_images: int = 2,
                 sampling: SamplingParams | None = None) -> ChatRequest:
    """A two-turn chat with ``n_images`` screenshots, our message format."""
    images = {f"frames/ep1/{i:03d}.jpg": make_jpeg(i) for i in range(n_images)}
    content: list[dict[str, Any]] = [{"type": "image", "image": ref} for ref in images]
    content.append({"type": "text", "text": text})
    messages = [{"role": "system", "content": "You are a web agent."}, {"role": "user", "content": content}]
    return ChatRequest(request_id=request_id, messages=messages, images=images,
                       sampling=sampling or SamplingParams(temperature=0.7, top_p=0.9, max_tokens=64))


@pytest_asyncio.fixture
async def echo() -> EchoTestModel:
    return EchoTestModel()


@pytest_asyncio.fixture
async def server(echo: EchoTestModel) -> AsyncIterator[ChatTestServer]:
    async with ChatTestServer(echo) as srv:
        yield srv


@contextlib.asynccontextmanager
async def started(srv: ChatTestServer, **kw: Any) -> AsyncIterator[OpenAIModel]:
    """A started client of ``srv``, closed on exit."""
    model = client(srv, **kw)
    await model.start()
    try:
        yield model
    finally:
        await model.close()


def client(srv: ChatTestServer, **kw: Any) -> OpenAIModel:
    """An OpenAIModel for ``srv`` with tiny backoffs."""
    args: dict[str, Any] = {"retries": 4, "backoff_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0}
    args.update(kw)
    return OpenAIModel(srv.base_url, srv.served_model_name, **args)


async def test_success_payload_and_reply(server: ChatTestServer, echo: EchoTestModel) -> None:
    async with started(server, token_ids=True, api_key="sk-test", extra_body={"repetition_penalty": 1.05}) as model:
        req = chat_request(sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=64, seed=7))
        gen = await model.generate(req)

    expected = "images=2 last=click the button"
    assert gen.text == expected
    assert gen.token_ids == [ord(c) for c in expected]
    assert gen.logprobs == pytest.approx([-0.01 * (i + 1) for i in range(len(expected))])
    assert gen.finish_reason == "stop"
    assert gen.prompt_tokens == 200 + len("click the button")
    assert gen.timings_ms["attempts"] == 1 and gen.timings_ms["http_ms"] > 0

    (rec,) = server.received
    p = rec.payload
    assert rec.headers["Authorization"] == "Bearer sk-test"
    assert p["model"] == "test-model"
    assert (p["temperature"], p["top_p"], p["top_k"], p["max_tokens"], p["seed"]) == (0.7, 0.9, 20, 64, 7)
    assert p["logprobs"] is True and p["top_logprobs"] == 0
    assert p["return_tokens_as_token_ids"] is True
    assert p["repetition_penalty"] == 1.05
    assert p["messages"][0] == {"role": "system", "content": "You are a web agent."}
    parts = p["messages"][1]["content"]
    assert [part["type"] for part in parts] == ["image_url", "image_url", "text"]
    for part, jpeg in zip(parts[:2], req.images.values(), strict=True):
        assert part["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    # The model behind the server got exactly the same JPEG bytes back.
    assert list(echo.requests[0].images.values()) == list(req.images.values())
    assert echo.requests[0].sampling.top_k == 20 and echo.requests[0].sampling.seed == 7


async def test_optional_fields_left_out(server: ChatTestServer) -> None:
    async with started(server) as model:
        gen = await model.generate(chat_request(n_images=0, sampling=SamplingParams(logprobs=False)))
    p = server.received[0].payload
    for key in ("seed", "top_k", "logprobs", "top_logprobs", "return_tokens_as_token_ids"):
        assert key not in p
    assert gen.text == "images=0 last=click the button"
    assert gen.logprobs is None and gen.token_ids is None  # no token_ids flag: vLLM gives none


async def test_logprobs_without_token_ids_flag(server: ChatTestServer) -> None:
    async with started(server) as model:
        gen = await model.generate(chat_request())
    assert "return_tokens_as_token_ids" not in server.received[0].payload
    assert gen.logprobs is not None and len(gen.logprobs) == len(gen.text)
    assert gen.token_ids is None


async def test_file_url_transport(echo: EchoTestModel, tmp_path: Path) -> None:
    req = chat_request()
    for ref, jpeg in req.images.items():
        (tmp_path / ref).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / ref).write_bytes(jpeg)
    async with ChatTestServer(echo, allowed_media_dir=tmp_path) as srv:
        async with started(srv, image_transport="file_url", run_dir=tmp_path) as model:
            gen = await model.generate(req)
        urls = [part["image_url"]["url"] for part in srv.received[0].payload["messages"][1]["content"][:2]]
    assert urls == [(tmp_path / ref).resolve().as_uri() for ref in req.images]
    assert gen.text.startswith("images=2")
    assert list(echo.requests[0].images.values()) == list(req.images.values())


async def test_reasoning_folded_into_think(echo: EchoTestModel) -> None:
    class ThinkingTestModel(LanguageModel):
        """A test stand-in that thinks before answering."""

        async def generate(self, request: ChatRequest) -> Generation:
            return Generation(text="<think>the button is blue</think>click(3)", finish_reason="stop")

    async with ChatTestServer(ThinkingTestModel(), reasoning_parser=True) as srv, started(srv) as model:
        gen = await model.generate(chat_request())
    assert gen.text == "<think>the button is blue</think>click(3)"
    # and the plain parsing path: "reasoning" (newer vLLM) and no reasoning at all
    model = OpenAIModel("http://127.0.0.1:9/v1", "m")
    msg = {"choices": [{"message": {"content": "ok", "reasoning": "hm"}, "finish_reason": "length"}]}
    assert model.parse_response(msg).text == "<think>hm</think>ok"
    gen = model.parse_response({"choices": [{"message": {"content": None}}]})
    assert gen.text == "" and gen.finish_reason is None


async def test_429_retry_after_honoured(server: ChatTestServer) -> None:
    server.fail_next(1, 429, retry_after=0.3, message="slow down")
    async with started(server, backoff_max_s=1.0) as model:
        t0 = time.monotonic()
        gen = await model.generate(chat_request())
        elapsed = time.monotonic() - t0
    assert gen.timings_ms["attempts"] == 2
    assert elapsed >= 0.29  # waited the server's Retry-After, not the 0.01 s backoff
    assert server.received[1].t - server.received[0].t >= 0.29
    assert gen.text.startswith("images=2")


@pytest.mark.wallclock
async def test_429_retry_after_capped(server: ChatTestServer) -> None:
    server.fail_next(1, 429, retry_after=30)
    async with started(server, backoff_max_s=0.1) as model:
        t0 = time.monotonic()
        gen = await model.generate(chat_request())
    assert time.monotonic() - t0 < 2.0
    assert gen.timings_ms["attempts"] == 2


async def test_500_twice_then_success(server: ChatTestServer) -> None:
    server.fail_next(2, 500)
    async with started(server) as model:
        gen = await model.generate(chat_request())
    assert gen.timings_ms["attempts"] == 3
    assert len(server.received) == 3
    assert gen.text.startswith("images=2")


async def test_dropped_connection_then_success(server: ChatTestServer) -> None:
    server.drop_next(1)
    async with started(server) as model:
        gen = await model.generate(chat_request())
    assert gen.timings_ms["attempts"] == 2


@pytest.mark.wallclock
async def test_timeout_then_success(server: ChatTestServer) -> None:
    server.delay_next(1, 2.0)
    async with started(server, timeout_s=0.3) as model:
        t0 = time.monotonic()
        gen = await model.generate(chat_request())
        elapsed = time.monotonic() - t0
    assert gen.timings_ms["attempts"] == 2
    assert 0.3 <= elapsed < 1.5


@pytest.mark.wallclock
async def test_retries_exhausted(server: ChatTestServer) -> None:
    server.fail_next(100, 503, message="engine overloaded")
    async with started(server, retries=3) as model:
        t0 = time.monotonic()
        with pytest.raises(PolicyError, match=r"after 4 attempts; last: HTTP 503: engine overloaded"):
            await model.generate(chat_request())
        assert time.monotonic() - t0 < 1.0
    assert len(server.received) == 4


@pytest.mark.wallclock
async def test_unreachable_server_bounded(server: ChatTestServer) -> None:
    await server.kill()  # nothing listens on the port any more
    async with started(server, retries=2) as model:
        t0 = time.monotonic()
        with pytest.raises(PolicyError, match="after 3 attempts; last: Client"):
            await model.generate(chat_request())
        assert time.monotonic() - t0 < 2.0


async def test_400_fails_at_once(server: ChatTestServer) -> None:
    server.fail_next(1, 400, message="This model's maximum context length is 4096 tokens.")
    async with started(server) as model:
        with pytest.raises(PolicyError, match="HTTP 400: This model's maximum context length is 4096 tokens"):
            await model.generate(chat_request())
        # a real validation error of the server (max_tokens < 1), not injected
        with pytest.raises(PolicyError, match="HTTP 400: max_tokens must be at least 1"):
            await model.generate(chat_request(sampling=SamplingParams(max_tokens=0)))
    assert len(server.received) == 2  # no retries


async def test_wrong_model_name_and_missing_image(server: ChatTestServer) -> None:
    model = OpenAIModel(server.base_url, "no-such-model", backoff_s=0.01)
    await model.start()
    try:
        with pytest.raises(PolicyError, match="does not exist"):
            await model.generate(chat_request())
        req = chat_request()
        req.images = {}
        with pytest.raises(PolicyError, match="no bytes for image"):
            await model.generate(req)
    finally:
        await model.close()


def test_malformed_replies() -> None:
    model = OpenAIModel("http://127.0.0.1:9/v1", "m", token_ids=True)
    for bad in ({}, {"choices": []}, {"choices": [{}]}, [], "x", {"choices": [{"message": "x"}]}):
        with pytest.raises(PolicyError):
            model.parse_response(bad)
    # token ids only when every entry is a "token_id:N"
    reply = {"choices": [{"message": {"content": "ab"}, "logprobs": {"content": [
        {"token": "token_id:5", "logprob": -1.0}, {"token": "b", "logprob": -2.0}]}}]}
    gen = model.parse_response(reply)
    assert gen.logprobs == [-1.0, -2.0] and gen.token_ids is None
    # Content as a list of parts (as some servers send it): the text of its text parts. Anything else that is not
    # text is the server's error, not a reply the parser or the record could take.
    parts = [{"type": "text", "text": "cl"}, {"type": "image_url"}, {"type": "text", "text": "ick"}]
    assert model.parse_response({"choices": [{"message": {"content": parts}}]}).text == "click"
    for message in ({"content": 5}, {"content": {"text": "x"}}, {"content": "x", "reasoning_content": ["r"]}):
        with pytest.raises(PolicyError, match="content is not text"):
            model.parse_response({"choices": [{"message": message}]})


def test_backoff_and_retry_after() -> None:
    model = OpenAIModel("http://127.0.0.1:9/v1", "m", backoff_s=0.5, backoff_max_s=8.0)
    for attempt, full in ((1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (30, 8.0)):
        for _ in range(20):
            assert full / 2 <= model._backoff(attempt, None) <= full  # capped, with jitter
    assert model._backoff(1, 3.0) == 3.0 and model._backoff(1, 60.0) == 8.0  # Retry-After, capped
    assert _parse_retry_after("2") == 2.0 and _parse_retry_after("0.25") == 0.25
    assert _parse_retry_after(None) is None and _parse_retry_after("soon") is None
    in_5s = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 <= (_parse_retry_after(in_5s) or 0.0) <= 5.0


@contextlib.asynccontextmanager
async def one_handler_server(handler: Callable[[Any], Awaitable[Any]], **model_kw: Any
                             ) -> AsyncIterator[OpenAIModel]:
    """A started OpenAIModel against a server whose ``/v1/chat/completions`` is ``handler`` (aiohttp)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    model = OpenAIModel(f"http://127.0.0.1:{port}/v1", "m", backoff_s=0.01, **model_kw)
    await model.start()
    try:
        yield model
    finally:
        await model.close()
        await runner.cleanup()


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("status", "body", "error"), [
    (200, "{not json", "malformed JSON"),
    # Before, a reply nested too deep raised RecursionError out of the backend, not a PolicyError.
    (200, DEEP, "malformed JSON .*recursion"),
    (200, '{"id": ' + "9" * 5000 + "}", "malformed JSON .*4300 digits"),
    (400, DEEP, "answered HTTP 400: " + re.escape("[" * 50)),
], ids=["syntax", "nested-too-deep", "number-too-long", "error-nested-too-deep"])
async def test_malformed_json_reply(status: int, body: str, error: str) -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, status=status, content_type="application/json")

    async with one_handler_server(handler) as model:
        with pytest.raises(PolicyError, match=error):
            await model.generate(chat_request())


async def test_a_weight_version_that_is_not_a_number_python_reads_is_none() -> None:
    # "²" is a digit to str.isdigit but not to int(); before, it raised ValueError out of the reply's parsing.
    from aiohttp import web

    versions = iter(["²", "9" * 5000, "12"])

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                                  "metadata": {"weight_version": next(versions)}})

    async with one_handler_server(handler) as model:
        served = [(await model.generate(chat_request(f"r{i}"))).policy_version for i in range(3)]
    assert served == [None, None, 12]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_reply_over_the_size_cap_fails_the_call_without_being_read_whole(declared: bool) -> None:
    from aiohttp import web

    sent: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if declared:
            resp.content_length = 64 << 20
        else:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 64 MiB, unless the client stops reading
                await resp.write(b" " * (1 << 20))
                sent.append(1)
        return resp

    async with one_handler_server(handler, max_reply_bytes=1 << 20) as model:
        with pytest.raises(PolicyError, match="over the 1,048,576-byte cap|over 1,048,576 bytes"):
            await model.generate(chat_request())
    assert len(sent) < 64  # the client stopped reading: the rest was never taken in


async def test_generate_before_start_and_after_close(server: ChatTestServer) -> None:
    model = client(server)
    with pytest.raises(PolicyError, match="before start"):
        await model.generate(chat_request())
    await model.start()
    await model.close()
    with pytest.raises(PolicyError, match="closed"):
        await model.generate(chat_request())


@pytest.mark.wallclock
async def test_close_fails_pending_calls(server: ChatTestServer) -> None:
    server.latency_s = 5.0
    model = client(server, max_in_flight=2)
    await model.start()
    calls = [asyncio.ensure_future(model.generate(chat_request(f"r{i}"))) for i in range(5)]
    await asyncio.sleep(0.2)  # two in the server, three waiting for the semaphore
    t0 = time.monotonic()
    await model.close()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 2.0)
    assert time.monotonic() - t0 < 1.0
    assert all(isinstance(r, PolicyError) for r in results), results


async def test_caller_cancellation_propagates(server: ChatTestServer) -> None:
    server.latency_s = 5.0
    async with started(server) as model:
        call = asyncio.ensure_future(model.generate(chat_request()))
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


async def test_in_flight_cap(server: ChatTestServer) -> None:
    server.latency_s = 0.1
    async with started(server, max_in_flight=4) as model:
        gens = await asyncio.gather(*(model.generate(chat_request(f"r{i}", text=f"t{i}")) for i in range(20)))
    assert [g.text for g in gens] == [f"images=2 last=t{i}" for i in range(20)]
    assert server.max_in_flight_seen == 4


@pytest.mark.wallclock
async def test_server_dies_mid_run(server: ChatTestServer) -> None:
    server.latency_s = 0.15
    # Retries span ~1.5 s of backoff, longer than the 0.4 s outage: calls caught by it mostly come through.
    async with started(server, max_in_flight=8, retries=10, backoff_s=0.02, backoff_max_s=0.2) as model:
        calls = [asyncio.ensure_future(model.generate(chat_request(f"r{i}", text=f"t{i}"))) for i in range(40)]
        await asyncio.sleep(0.25)  # 8 answered, 8 in flight
        await server.kill()
        assert any(not c.done() for c in calls)
        await asyncio.sleep(0.4)
        await server.start()  # same port
        t0 = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10.0)
        assert time.monotonic() - t0 < 8.0
        assert all(isinstance(r, Generation | PolicyError) for r in results), results
        ok = [r for r in results if isinstance(r, Generation)]
        assert len(ok) >= 32  # at least everything that was not in flight when it died
        for i, r in enumerate(results):
            if isinstance(r, Generation):
                assert r.text == f"images=2 last=t{i}"
        assert max(r.timings_ms["attempts"] for r in ok) >= 2
        # and the client works normally afterwards
        server.latency_s = 0.0
        gen = await model.generate(chat_request("after"))
        assert gen.timings_ms["attempts"] == 1


async def test_real_tiny_model_behind_server(tmp_path: Path) -> None:
    """The real tiny Qwen3-VL (transformers, CPU) behind the test server, through the HTTP client."""
    tiny_models = pytest.importorskip("policy.tiny_models")
    hf_backend = pytest.importorskip("policy.hf_backend")
    model_dir = tiny_models.build_tiny_model(tmp_path / "tiny", arch="qwen3_vl")
    hf = hf_backend.HFModel(model_dir, device="cpu")
    await hf.start()
    try:
        async with ChatTestServer(hf, served_model_name="tiny-qwen3-vl") as srv:
            model = OpenAIModel(srv.base_url, "tiny-qwen3-vl", token_ids=True, backoff_s=0.01, timeout_s=60.0)
            await model.start()
            try:
                req = chat_request(n_images=1, sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8,
                                                                       seed=0))
                gen = await model.generate(req)
            finally:
                await model.close()
    finally:
        await hf.close()
    assert isinstance(gen.text, str)
    assert gen.token_ids is not None and 1 <= len(gen.token_ids) <= 8
    assert gen.logprobs is not None and len(gen.logprobs) == len(gen.token_ids)
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert gen.prompt_tokens is not None and gen.prompt_tokens > 0
    assert gen.finish_reason in ("stop", "length")
