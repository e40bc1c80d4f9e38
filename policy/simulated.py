"""``simulated``: a latency model of a served VLM, for benchmarks only. It is not a model.

It answers every chat with a valid, seeded random web-agent reply (in the "complete" format, with one
``<tool_call>``), after the time a real inference server would take:

- prefill: ``prefill_ms + image_ms`` per image in the prompt;
- output length: log-normal (median ``median_tokens``, shape ``sigma``; heavy right tail), capped at
  ``max_tokens``;
- decode: ``token_ms`` per output token, growing with the number of requests in flight as a batched server
  slows down: ``token_ms * (1 + in_flight / knee)``. The requests share the server continuously
  (:class:`SharedDecoding`): whenever one joins or leaves, every decoding request's pace changes at that instant,
  as a continuously batching server decodes one token of every running sequence per forward pass.

``speed`` divides every duration (tests use a large value). Replies are drawn from a seeded RNG, so
a run is reproducible up to scheduling order. With ``fixed_work`` the work itself no longer depends on the
order: each episode answers at a step drawn once for it (geometric with ``answer_rate``, from a seeded RNG keyed
by the episode), and each reply (its action and its number of tokens) comes from a seeded RNG keyed by the
request, so that two runs of the same episodes in different orders (the asynchronous engine and its lock-step
baseline) make the same model and browser work. The episode and the step are read from the request id that
:class:`policy.agent_policy.AgentPolicy` gives, ``EPISODE/STEP``; a request without one falls back to the shared
RNG.

:meth:`LatencyModel.qwen_vl_7b_h100` is the latency of a served Qwen2.5-VL-7B on one H100, calibrated to
published serving figures (sources in its docstring); the defaults are an older, rounder guess that the RL-loop
benchmark and the tests keep using.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import dataclass

from engine.agent.model_api import ChatRequest, Generation, LanguageModel, image_refs

_WORDS = ("mug", "lamp", "paris", "london", "history", "review", "blue", "2", "hello", "search")
_ELEMENT_ID = re.compile(r"^id: (\d+),", re.MULTILINE)


#: The served-model figures :meth:`LatencyModel.qwen_vl_7b_h100` is calibrated to (see its docstring).
NIM_LLAMA31_8B_ITL_MS = {1: 4.63, 50: 5.91, 100: 7.57}  # inter-token latency by concurrent requests
# image_tokens: a 1920x1080 image after Qwen2.5-VL's smart_resize (1932x1092, 69x39 tokens of 28 px), of the 2,718.
QWEN25VL_7B_H100_1080P = {"encoder_ms": 167.0, "prefill_ms": 126.0, "prompt_tokens": 2718, "image_tokens": 2691}
SCREENSHOT_IMAGE_TOKENS = 1242  # a 1280x768 screenshot after Qwen2.5-VL's smart_resize: 1288x756, 46x27 tokens of 28 px
# The agent's text around the images in Set-of-Marks mode, about 8,000 characters: the system prompt (2.9k), the
# task, the element list and the summaries of older steps.
TEXT_PROMPT_TOKENS = 2000


@dataclass(frozen=True)
class LatencyModel:
    """The documented latency parameters (defaults: roughly an 8B VLM on one GPU, a round guess; the calibrated
    preset is :meth:`qwen_vl_7b_h100`)."""

    prefill_ms: float = 40.0
    image_ms: float = 15.0
    token_ms: float = 12.0
    knee: float = 64.0
    median_tokens: float = 90.0
    sigma: float = 0.6
    speed: float = 1.0

    @classmethod
    def from_decode_rates(cls, ms_at_1: float, ms_at_n: float, n: int, **kw: float) -> LatencyModel:
        """The model whose per-token time is ``ms_at_1`` with one request decoding and ``ms_at_n`` with ``n``:
        solves ``token_ms * (1 + 1/knee) = ms_at_1`` and ``token_ms * (1 + n/knee) = ms_at_n``."""
        ratio = ms_at_n / ms_at_1
        if not ratio > 1:
            raise ValueError("decoding must slow down with more requests (ms_at_n > ms_at_1)")
        knee = (n - ratio) / (ratio - 1)
        return cls(token_ms=ms_at_1 * knee / (knee + 1), knee=knee, **kw)

    @classmethod
    def qwen_vl_7b_h100(cls, speed: float = 1.0) -> LatencyModel:
        """Qwen2.5-VL-7B served on one H100, from published figures (a benchmark stand-in's calibration):

        - decode: NVIDIA's NIM benchmarking page (docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance,
          Llama-3.1-8B-Instruct, NIM 1.8.0): inter-token latency 4.63 ms with 1 request (216 tokens/s per sequence)
          and 7.57 ms with 100 concurrent requests (132 tokens/s per sequence); the 7.6B language model of
          Qwen2.5-VL-7B is of the same size class. The table does not restate its GPU profile (the page's 70B
          table is on H100 80 GB, fp8), so a BF16 deployment may decode somewhat slower. Solved for ``token_ms``
          4.60 ms and ``knee`` 155.
        - images: vLLM issue #41267 (Qwen2.5-VL-7B on one H100 80 GB, vLLM 0.19.1, one 1080p image, 2,718 prompt
          tokens): vision encoder 167 ms, prefill 126 ms. Per token: 0.062 ms in the encoder (2,691 image tokens)
          and 0.046 ms of prefill, so one 1280x768 screenshot (1,242 tokens) costs 135 ms and the text around the
          images (about 2,000 tokens) 93 ms.
        """
        itl = NIM_LLAMA31_8B_ITL_MS
        vl = QWEN25VL_7B_H100_1080P
        prefill_per_token = vl["prefill_ms"] / vl["prompt_tokens"]
        encoder_per_token = vl["encoder_ms"] / vl["image_tokens"]
        return cls.from_decode_rates(
            itl[1], itl[100], 100,
            prefill_ms=round(prefill_per_token * TEXT_PROMPT_TOKENS, 1),
            image_ms=round((prefill_per_token + encoder_per_token) * SCREENSHOT_IMAGE_TOKENS, 1), speed=speed)

    def prefill_s(self, images: int) -> float:
        """Seconds to the first token of a request with ``images`` images."""
        return (self.prefill_ms + self.image_ms * images) / 1000 / self.speed

    def token_s(self, in_flight: int) -> float:
        """Seconds per output token while ``in_flight`` requests (this one included) are being served."""
        return self.token_ms * (1 + in_flight / self.knee) / 1000 / self.speed


class SharedDecoding:
    """The requests in flight on one simulated server, and each decoding request's tokens still to decode.

    Bookkeeping only, on the clock its callers pass: between two events (a request joins, starts decoding or
    leaves), every decoding request advances by ``elapsed / token_s(in_flight)`` tokens. So a request wakes only
    when it is done, however often the pace changes (one timer for the whole server, see :class:`SimulatedModel`).
    """

    def __init__(self, latency: LatencyModel) -> None:
        self.latency = latency
        self._members: set[int] = set()
        self._left: dict[int, float] = {}  # request -> tokens still to decode
        self._clock = 0.0
        self._next_id = 0

    @property
    def in_flight(self) -> int:
        """Requests prefilling or decoding."""
        return len(self._members)

    def _advance(self, now: float) -> None:
        if now > self._clock:
            if self._left:
                tokens = (now - self._clock) / self.latency.token_s(len(self._members))
                for request in self._left:
                    self._left[request] -= tokens
            self._clock = now

    def join(self, now: float) -> int:
        """A request arrives (its prefill slows the others too); returns its id."""
        self._advance(now)
        self._next_id += 1
        self._members.add(self._next_id)
        return self._next_id

    def decode(self, now: float, request: int, tokens: int) -> None:
        """``request`` (joined) starts decoding ``tokens`` tokens."""
        self._advance(now)
        self._left[request] = float(tokens)

    def leave(self, now: float, request: int) -> bool:
        """``request`` leaves early (cancelled); False if it had already finished."""
        if request not in self._members:
            return False
        self._advance(now)
        self._members.discard(request)
        self._left.pop(request, None)
        return True

    def due(self) -> float | None:
        """The clock time at which the next decoding request finishes at the current pace (None: none decodes)."""
        if not self._left:
            return None
        return self._clock + min(self._left.values()) * self.latency.token_s(len(self._members))

    def pop_finished(self, now: float, slack_s: float = 0.0) -> list[int]:
        """The requests done by ``now`` (or within ``slack_s`` of it), which leave the server."""
        self._advance(now)
        slack = slack_s / self.latency.token_s(len(self._members)) + 1e-9  # and the rounding of the advances
        done = [request for request, left in self._left.items() if left <= slack]
        for request in done:
            del self._left[request]
            self._members.discard(request)
        return done


class SimulatedModel(LanguageModel):
    """Random valid replies at a served model's pace (a benchmark stand-in, named as such)."""

    name = "simulated"
    model_name = "simulated-latency-model"

    def __init__(self, seed: int = 0, latency: LatencyModel | None = None, answer_rate: float = 0.05,
                 fixed_work: bool = False) -> None:
        self.latency = latency or LatencyModel()
        self.answer_rate = answer_rate
        self.fixed_work = fixed_work
        self.seed = seed
        self._rng = random.Random(seed)
        self._server = SharedDecoding(self.latency)
        self._waiting: dict[int, asyncio.Future[None]] = {}  # decoding request -> its reply's wake-up
        self._timer: asyncio.TimerHandle | None = None

    @property
    def in_flight(self) -> int:
        """Requests being served (prefilling or decoding)."""
        return self._server.in_flight

    def answer_step(self, episode_id: str) -> int:
        """With ``fixed_work``: the number of the step (1-based) at which ``episode_id`` answers, geometric with
        ``answer_rate`` (the episode's step cap may end it first)."""
        rng = random.Random(f"{self.seed}:{episode_id}")
        steps = 1
        while rng.random() >= self.answer_rate:
            steps += 1
        return steps

    def output_tokens(self, request_id: str, cap: int) -> int:
        """With ``fixed_work``: the number of tokens the reply to ``request_id`` decodes (``cap``: max_tokens)."""
        return self._tokens(self._request_rng(request_id, "tokens"), cap)

    def _request_rng(self, request_id: str, what: str) -> random.Random:
        # String seeds hash the same way in every process, so a request id always draws the same; one stream per
        # draw, so the token count does not depend on how many draws the reply's action took.
        return random.Random(f"{self.seed}:{request_id}:{what}")

    def _tokens(self, rng: random.Random, cap: int) -> int:
        lm = self.latency
        return max(1, min(cap, round(rng.lognormvariate(math.log(lm.median_tokens), lm.sigma))))

    def _plan(self, request: ChatRequest) -> tuple[random.Random, bool | None]:
        """The RNG of this reply, and whether it answers (None: drawn with ``answer_rate`` like every action)."""
        episode, _, step = request.request_id.rpartition("/")
        if not (self.fixed_work and episode and step.isdigit()):
            return self._rng, None
        return self._request_rng(request.request_id, "reply"), int(step) + 1 >= self.answer_step(episode)

    def _arguments(self, request: ChatRequest, rng: random.Random, answers: bool | None) -> dict[str, object]:
        last = request.messages[-1]["content"] if request.messages else []
        text = "\n".join(p["text"] for p in last if isinstance(last, list) and p.get("type") == "text")
        ids = [int(m) for m in _ELEMENT_ID.findall(text)]
        # With the answer fixed per episode, the other actions keep their shares of the rest of [0, 1).
        r = rng.random() if answers is None else rng.uniform(self.answer_rate, 1.0)
        if answers or (answers is None and r < self.answer_rate):
            return {"action": "answer", "text": rng.choice(_WORDS)}
        target: dict[str, object] = ({"element_id": rng.choice(ids)} if ids else
                                     {"coordinate": [rng.randint(0, 1000), rng.randint(0, 1000)]})
        if r < 0.6:
            return {"action": "left_click", **target}
        if r < 0.75:
            return {"action": "type", "text": rng.choice(_WORDS), **target}
        if r < 0.9:
            return {"action": "scroll", "direction": rng.choice(("up", "down"))}
        if r < 0.95:
            return {"action": "go_back"}
        return {"action": "wait", "time": 1}

    def _reply(self, request: ChatRequest, rng: random.Random, answers: bool | None) -> str:
        args = self._arguments(request, rng, answers)
        call = json.dumps({"name": "computer_use", "arguments": args})
        return (f'Memory: []\nProgress: {{"task": "in progress"}}\nIntention: explore the page\n'
                f"Action: {args['action']}\n<tool_call>\n{call}\n</tool_call>")

    async def generate(self, request: ChatRequest) -> Generation:
        lm = self.latency
        t0 = time.monotonic()
        rng, answers = self._plan(request)
        text = self._reply(request, rng, answers)
        cap = request.sampling.max_tokens
        n_tokens = self._tokens(rng, cap) if answers is None else self.output_tokens(request.request_id, cap)
        request_no = self._server.join(time.monotonic())
        self._rearm()
        try:
            await asyncio.sleep(lm.prefill_s(len(image_refs(request.messages))))
            done = asyncio.get_running_loop().create_future()
            self._waiting[request_no] = done
            self._server.decode(time.monotonic(), request_no, n_tokens)
            self._rearm()
            await done
        finally:
            self._waiting.pop(request_no, None)
            if self._server.leave(time.monotonic(), request_no):
                self._rearm()
        finish = "length" if n_tokens >= request.sampling.max_tokens else "stop"
        return Generation(text, finish_reason=finish,
                          timings_ms={"simulated_tokens": n_tokens, "total_ms": (time.monotonic() - t0) * 1000})

    def _rearm(self) -> None:
        """One timer for the server: at the next decoding request's finish, at the pace of now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self._server.due()
        if due is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + max(0.0, due - time.monotonic()), self._wake_finished)

    def _wake_finished(self) -> None:
        self._timer = None
        # The event loop's timers may fire up to a millisecond early: count a request that close to done as done.
        for request_no in self._server.pop_finished(time.monotonic(), slack_s=0.001):
            done = self._waiting.pop(request_no)
            if not done.done():
                done.set_result(None)
        self._rearm()
