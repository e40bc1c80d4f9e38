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
a run is reproducible up to scheduling order.
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


@dataclass(frozen=True)
class LatencyModel:
    """The documented latency parameters (defaults: roughly an 8B VLM on one GPU)."""

    prefill_ms: float = 40.0
    image_ms: float = 15.0
    token_ms: float = 12.0
    knee: float = 64.0
    median_tokens: float = 90.0
    sigma: float = 0.6
    chunk: int = 16
    speed: float = 1.0


class SimulatedModel(LanguageModel):
    """Random valid replies at a served model's pace (a benchmark stand-in, named as such)."""

    name = "simulated"
    model_name = "simulated-latency-model"

    def __init__(self, seed: int = 0, latency: LatencyModel | None = None, answer_rate: float = 0.05) -> None:
        self.latency = latency or LatencyModel()
        self.answer_rate = answer_rate
        self._rng = random.Random(seed)
        self.in_flight = 0

    def _output_tokens(self, cap: int) -> int:
        lm = self.latency
        return max(1, min(cap, round(self._rng.lognormvariate(math.log(lm.median_tokens), lm.sigma))))

    def _arguments(self, request: ChatRequest) -> dict[str, object]:
        rng = self._rng
        last = request.messages[-1]["content"] if request.messages else []
        text = "\n".join(p["text"] for p in last if isinstance(last, list) and p.get("type") == "text")
        ids = [int(m) for m in _ELEMENT_ID.findall(text)]
        r = rng.random()
        if r < self.answer_rate:
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

    def _reply(self, request: ChatRequest) -> str:
        args = self._arguments(request)
        call = json.dumps({"name": "computer_use", "arguments": args})
        return (f'Memory: []\nProgress: {{"task": "in progress"}}\nIntention: explore the page\n'
                f"Action: {args['action']}\n<tool_call>\n{call}\n</tool_call>")

    async def generate(self, request: ChatRequest) -> Generation:
        lm = self.latency
        t0 = time.monotonic()
        text = self._reply(request)
        n_tokens = self._output_tokens(request.sampling.max_tokens)
        self.in_flight += 1
        try:
            await asyncio.sleep((lm.prefill_ms + lm.image_ms * len(image_refs(request.messages))) / 1000 / lm.speed)
            done = 0
            while done < n_tokens:
                step = min(lm.chunk, n_tokens - done)
                per_token = lm.token_ms * (1 + self.in_flight / lm.knee)
                await asyncio.sleep(step * per_token / 1000 / lm.speed)
                done += step
        finally:
            self.in_flight -= 1
        finish = "length" if n_tokens >= request.sampling.max_tokens else "stop"
        return Generation(text, finish_reason=finish,
                          timings_ms={"simulated_tokens": n_tokens, "total_ms": (time.monotonic() - t0) * 1000})
