"""``simulated``: a latency model of a served VLM, for benchmarks only. It is not a model.

It answers every chat with a valid, seeded random web-agent reply (in the "complete" format, with one
``<tool_call>``), after the time a real inference server would take:

- prefill: ``prefill_ms + image_ms`` per image in the prompt;
- output length: log-normal (median ``median_tokens``, shape ``sigma``; heavy right tail), capped at
  ``max_tokens``;
- decode: ``token_ms`` per output token, growing with the number of requests decoding at the same
  time as a batched server slows down: ``token_ms * (1 + in_flight / knee)``. The rate is re-read
  every ``chunk`` tokens, so a request slows down when others join it.

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

from engine.model_api import ChatRequest, Generation, LanguageModel, image_refs

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
    chunk: int = 16
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
        self.in_flight = 0

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
        self.in_flight += 1
        try:
            await asyncio.sleep(lm.prefill_s(len(image_refs(request.messages))))
            done = 0
            while done < n_tokens:
                step = min(lm.chunk, n_tokens - done)
                await asyncio.sleep(step * lm.token_s(self.in_flight))
                done += step
        finally:
            self.in_flight -= 1
        finish = "length" if n_tokens >= request.sampling.max_tokens else "stop"
        return Generation(text, finish_reason=finish,
                          timings_ms={"simulated_tokens": n_tokens, "total_ms": (time.monotonic() - t0) * 1000})
