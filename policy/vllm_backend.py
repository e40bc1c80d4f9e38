"""``vllm``: an in-process vLLM engine (asynchronous), an optional extra: ``pip install 'webgym-engine[vllm]'``.

vLLM batches the requests of all rollouts itself (continuous batching). The prompt is rendered with the
model's own chat template (image parts become the model's vision placeholders, which vLLM expands);
screenshots are decoded by the compiled codec and handed over as images; vLLM's processor resizes them
exactly as the served model does. Token ids and the sampled tokens' log-probabilities come back with
every reply.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine import _imgcodec as codec
from engine.agent.model_api import ChatRequest, Generation, LanguageModel, image_refs
from engine.agent.policy_api import PolicyError

INSTALL_HINT = ("the vllm backend needs vLLM, which is not installed: pip install 'webgym-engine[vllm]' on a GPU "
                "machine, or vLLM's CPU build (docs/vllm-cpu.md); or serve the model with `vllm serve` and use "
                "--policy openai")


def _require_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from None
    return vllm


class VLLMModel(LanguageModel):
    """A local model directory served in-process by ``vllm.AsyncLLMEngine``."""

    name = "vllm"

    def __init__(self, model_dir: str, max_images: int = 5, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.85, engine_kwargs: dict[str, Any] | None = None) -> None:
        self.vllm = _require_vllm()  # fail at construction, with the hint, not at the first request
        self.model_name = model_dir
        self.max_images = max_images
        self.engine_kwargs = {"max_model_len": max_model_len, "gpu_memory_utilization": gpu_memory_utilization,
                              **(engine_kwargs or {})}
        # vLLM's default logprobs_mode, raw_logprobs, is the model's own distribution (what the trainer computes).
        mode = self.engine_kwargs.get("logprobs_mode") or "raw_logprobs"
        self.logprobs_of = "model" if mode == "raw_logprobs" else "sampler"
        self._engine: Any = None
        self._tokenizer: Any = None

    async def start(self) -> None:
        from transformers import AutoTokenizer

        args = self.vllm.AsyncEngineArgs(model=self.model_name, limit_mm_per_prompt={"image": self.max_images},
                                         **{k: v for k, v in self.engine_kwargs.items() if v is not None})
        self._engine = self.vllm.AsyncLLMEngine.from_engine_args(args)
        self._tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_name)

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()

    def _prompt(self, request: ChatRequest) -> dict[str, Any]:
        from PIL import Image

        text = self._tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True)
        images = []
        for ref in image_refs(request.messages):
            if ref not in request.images:
                raise PolicyError(f"vllm: request {request.request_id}: no bytes for image {ref!r}")
            images.append(Image.fromarray(codec.decode(request.images[ref])))
        return {"prompt": text, "multi_modal_data": {"image": images}} if images else {"prompt": text}

    def _sampling(self, request: ChatRequest) -> Any:
        s = request.sampling
        kwargs: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens,
                                  "seed": s.seed, "logprobs": 0 if s.logprobs else None}
        if s.top_k is not None:
            kwargs["top_k"] = s.top_k
        return self.vllm.SamplingParams(**kwargs)

    async def generate(self, request: ChatRequest) -> Generation:
        if self._engine is None:
            raise PolicyError("vllm: backend not started or closed")
        t0 = time.perf_counter()
        try:
            prompt = await asyncio.to_thread(self._prompt, request)
            final = None
            async for output in self._engine.generate(prompt, self._sampling(request), request.request_id):
                final = output
        except PolicyError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine failure ends this request, not the run
            raise PolicyError(f"vllm: request {request.request_id}: {type(exc).__name__}: {exc}") from exc
        if final is None or not final.outputs:
            raise PolicyError(f"vllm: request {request.request_id}: no output")
        out = final.outputs[0]
        token_ids = list(out.token_ids)
        logprobs = None
        if out.logprobs is not None:  # one {token_id: Logprob} per generated token
            logprobs = [float(step[tid].logprob) for tid, step in zip(token_ids, out.logprobs, strict=False)]
        return Generation(out.text, token_ids=token_ids, logprobs=logprobs,
                          logprobs_of=self.logprobs_of if logprobs is not None else None,
                          prompt_tokens=len(final.prompt_token_ids or []), finish_reason=out.finish_reason,
                          timings_ms={"generate_ms": (time.perf_counter() - t0) * 1000})
