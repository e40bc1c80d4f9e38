"""The engine's in-process ``vllm`` backend (policy/vllm_backend.py) on the CPU, run by .venv-vllm's Python.

``python vllm_in_process.py MODEL_DIR...`` starts one vLLM engine per checkpoint in this process, asks it one
screenshot request, greedy, and prints one JSON line per checkpoint: the reply's text, token ids and
log-probabilities. tests/frameworks/test_vllm.py runs it and compares the replies with the ``hf`` backend's.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np

from engine import _imgcodec as codec
from engine.agent.model_api import ChatRequest, SamplingParams
from policy.vllm_backend import VLLMModel

MAX_TOKENS = 16
# As docs/vllm-cpu.md serves it: float32 (the trainer's arithmetic), no CUDA graphs, a short context.
ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True}


def screenshot_request() -> ChatRequest:
    """One agent turn: a task, a 320x200 page screenshot (a header bar and a red button), greedy decoding."""
    page = np.full((200, 320, 3), 245, np.uint8)
    page[:24] = (30, 60, 140)
    page[90:114, 40:130] = (200, 40, 40)
    messages = [{"role": "system", "content": "You are a web agent. Answer with one action."},
                {"role": "user", "content": [{"type": "text", "text": "Task: click the red button."},
                                             {"type": "image", "image": "page.jpg"}]}]
    return ChatRequest("in-process", messages, {"page.jpg": codec.encode(page, 85)},
                       SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))


async def answer(model_dir: str) -> dict[str, object]:
    """The in-process backend's reply to :func:`screenshot_request` from ``model_dir``."""
    model = VLLMModel(model_dir, max_model_len=4096, engine_kwargs=ENGINE_KWARGS)
    await model.start()
    try:
        reply = await model.generate(screenshot_request())
    finally:
        await model.close()
    return {"model": model_dir, "text": reply.text, "token_ids": reply.token_ids, "logprobs": reply.logprobs,
            "logprobs_of": reply.logprobs_of, "logprobs_vision_masked": reply.logprobs_vision_masked,
            "prompt_tokens": reply.prompt_tokens}


def main(model_dirs: list[str]) -> None:
    for model_dir in model_dirs:
        print(json.dumps(asyncio.run(answer(model_dir))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
