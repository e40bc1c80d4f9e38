"""The in-process transformers backend (``hf``): a Qwen-VL model in this process, with dynamic batching.

Requests from many rollouts are collected into batches: the batching task takes the first queued
request, waits at most ``batch_wait_ms`` for more (up to ``max_batch``; requests that queued while the
previous batch ran go at once) and runs one ``model.generate`` per group of requests with the same
sampling parameters, in a dedicated worker thread (torch releases the GIL, so the event loop and the
browsers keep going). Prompts are left-padded; each request's images are preprocessed on the
project's codec (:mod:`policy.vision`) before it queues, so a broken screenshot fails only its own
request.

Sampling: temperature 0 is greedy decoding; otherwise temperature, then top-k, then top-p, applied by this
module's own logits processors in that order (the model's ``generation_config`` defaults such as repetition
penalties are not applied). Each generated token's log-probability is taken under the model's own distribution,
before temperature, top-k and top-p (vision placeholders suppressed, as they are for sampling;
``vision_in_logprobs=True`` keeps them in, as vLLM's log-probs do): the distribution the trainer computes, so
that a token's behaviour and proximal log-probs are comparable and an update's importance weights are 1 before
the weights move. ``Generation.logprobs_of`` is ``"model"`` (and the step record's ``parsed.logprobs_of`` says
so). With ``logprobs_of="temperature"`` they are taken after the temperature instead
(``log_softmax(logits / T)``, still before top-k and top-p), as SGLang reports them by default, so that a test
server can stand in for one; greedy requests (no temperature) record ``"model"`` all the same. ``max_tokens`` may
differ inside a batch: the batch runs to the largest and each reply is cut at its own limit, which gives the same
tokens as a shorter run (decoding is causal).

Seeds: a batch's random draws come from torch's global generator, reseeded with the seed of the
batch's first request that has one (``torch.manual_seed``: CPU and all GPUs). A seed therefore makes a
*batch* reproducible (same requests, same order, same seed), not a request on its own: a request's
sample also depends on its batch-mates. Requests without seeds do not reseed. Greedy replies never
depend on the batch (up to float rounding).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.agent.model_api import ChatRequest, Generation, LanguageModel, SamplingParams
from engine.agent.policy_api import PolicyError
from policy.prompting import (
    PromptError,
    build_prompt_ids,
    image_token_id_of,
    load_tokenizer,
    prompt_sha256,
)
from policy.vision import ProcessedImage, VisionConfig, resize_of, stack_images, vision_config_of
from policy.vision_attention import VISION_ATTENTION_MODES, set_vision_attention
from policy.vision_tokens import vision_token_ids

log = logging.getLogger(__name__)

#: The distributions this backend can take log-probs under (engine.agent.model_api.LOGPROBS_KINDS).
_RECORDABLE = ("model", "temperature")

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}


@dataclasses.dataclass(slots=True)
class _Item:
    """One request on its way through the queue."""

    request: ChatRequest
    input_ids: list[int]
    images: list[ProcessedImage]
    future: asyncio.Future[Generation]
    enqueued: float  # time.perf_counter()
    prep_ms: float


def _group_key(sampling: SamplingParams) -> tuple[Any, ...]:
    # max_tokens and seed are not part of the key (see the module docstring): they do not prevent batching.
    if sampling.temperature <= 0:
        return ("greedy",)
    return ("sample", float(sampling.temperature), float(sampling.top_p), int(sampling.top_k or 0))


class HFModel(LanguageModel):
    """A Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) run in this process with transformers.

    ``model_dir`` is a Hugging Face model directory (weights, tokenizer with chat template,
    ``preprocessor_config.json``). ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when
    available). ``dtype``: ``"auto"`` (bfloat16 on CUDA, float32 on CPU), ``"bfloat16"``, ``"float16"``,
    ``"float32"`` or a ``torch.dtype``. ``max_batch`` caps the requests per batch, ``batch_wait_ms`` how long
    the first request of a batch waits for company. ``attn_implementation`` goes to ``from_pretrained``
    (``None``: transformers' default, SDPA) and sets the language model's attention. ``vision_attention``: the
    vision tower's, ``"varlen"`` (one attention call per block for all images and windows,
    :mod:`policy.vision_attention`; where the model supports it) or ``"default"`` (transformers' own loop over
    images and windows). ``logprobs_of``: the distribution the replies' log-probs are taken
    under, ``"model"`` (the model's own) or ``"temperature"`` (after the request's temperature, SGLang's default;
    see :data:`engine.agent.model_api.LOGPROBS_KINDS`). ``vision_in_logprobs``: take them over the whole
    vocabulary, the vision placeholders included (which are never sampled all the same), as vLLM reports them.
    """

    name = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "auto",
        dtype: Any = "auto",
        max_batch: int = 16,
        batch_wait_ms: float = 5.0,
        *,
        attn_implementation: str | None = None,
        logprobs_of: str = "model",
        vision_attention: str = "varlen",
        vision_in_logprobs: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if vision_attention not in VISION_ATTENTION_MODES:
            raise ValueError(f"vision_attention must be one of {', '.join(VISION_ATTENTION_MODES)}, "
                             f"not {vision_attention!r}")
        self.vision_attention = vision_attention
        if logprobs_of not in _RECORDABLE:
            raise ValueError(f"logprobs_of must be one of {', '.join(_RECORDABLE)}, not {logprobs_of!r}")
        self.logprobs_of = logprobs_of
        self.vision_in_logprobs = vision_in_logprobs
        self.model_dir = Path(model_dir)
        self.model_name = str(model_dir)
        self.device_spec = device
        self.dtype_spec = dtype
        self.max_batch = int(max_batch)
        self.batch_wait_ms = float(batch_wait_ms)
        self.attn_implementation = attn_implementation

        self.model: Any = None
        self.tokenizer: Any = None
        self.vision: VisionConfig | None = None
        self.device: Any = None
        self.dtype: Any = None
        self.image_token_id: int = -1
        self.pad_token_id: int = 0
        self.stop_token_ids: set[int] = set()
        self.vision_token_ids: set[int] = set()
        self._wants_mm_token_types = False
        self._tokenizer_lock = threading.Lock()
        self.version: int | None = None  # set by load_weights: the replies' policy version

        # One thread runs the model: generate calls never overlap (one model, one device).
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: collections.deque[_Item] = collections.deque()
        self._in_flight: list[_Item] = []
        self._wakeup: asyncio.Event | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._closed = False

        # Counters, for tests and stats.
        self.batches_run = 0  # batches taken from the queue
        self.generate_calls = 0  # model.generate calls (one per sampling group of a batch, plus retries)
        self.requests_batched = 0  # requests in those batches
        self.requests_failed = 0
        self.batch_sizes: list[int] = []

    # ------------------------------------------------------------------ lifecycle

    @property
    def mean_batch_size(self) -> float:
        """Mean number of requests per batch so far (0.0 before the first)."""
        return self.requests_batched / self.batches_run if self.batches_run else 0.0

    def stats(self) -> dict[str, float]:
        """Counters: batches, generate calls, requests, failures, mean batch size."""
        return {"batches": self.batches_run, "generate_calls": self.generate_calls,
                "requests": self.requests_batched, "failed": self.requests_failed,
                "mean_batch_size": self.mean_batch_size}

    async def start(self) -> None:
        """Load the model, tokenizer and image-processor config in the model thread, start the batcher."""
        if self._batcher is not None:
            return
        self._closed = False
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-model")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._load)
        except Exception as exc:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise PolicyError(f"hf: cannot load {self.model_dir}: {type(exc).__name__}: {exc}") from exc
        self._wakeup = asyncio.Event()
        self._batcher = asyncio.create_task(self._batch_loop(), name="hf-batcher")

    def _load(self) -> None:
        import torch
        import transformers
        from transformers import AutoConfig, GenerationConfig

        if self.device_spec == "auto":
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            device = torch.device(self.device_spec)
        if isinstance(self.dtype_spec, torch.dtype):
            dtype = self.dtype_spec
        elif self.dtype_spec == "auto":
            # bf16 on GPUs that have it (the released checkpoints are bf16); float32 on CPU, where bf16 matmuls
            # are slow on most machines and numerics matter more than memory for small models.
            bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
            dtype = torch.bfloat16 if bf16_ok else (torch.float16 if device.type == "cuda" else torch.float32)
        else:
            name = _DTYPES.get(str(self.dtype_spec).lower().removeprefix("torch."))
            if name is None:
                raise ValueError(f"unknown dtype {self.dtype_spec!r}")
            dtype = getattr(torch, name)

        config = AutoConfig.from_pretrained(self.model_dir)
        kwargs: dict[str, Any] = {}
        if self.attn_implementation:
            kwargs["attn_implementation"] = self.attn_implementation
        kwargs.update(_dtype_kwarg(dtype))
        model_cls: Any = None
        with contextlib.suppress(Exception):
            from transformers import AutoModelForImageTextToText

            model_cls = AutoModelForImageTextToText._model_mapping[type(config)]
        if model_cls is None:  # an older transformers, or a config the auto class does not map
            archs = getattr(config, "architectures", None) or []
            model_cls = next((getattr(transformers, a) for a in archs if hasattr(transformers, a)), None)
        if model_cls is None:
            raise ValueError(f"no transformers class for model type {config.model_type!r}")
        model = model_cls.from_pretrained(self.model_dir, config=config, **kwargs).to(device).eval()
        set_vision_attention(model, self.vision_attention)

        tokenizer = load_tokenizer(self.model_dir)

        image_token_id = image_token_id_of(tokenizer, config)
        stop: set[int] = set()
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        for ids in (gen_eos, tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"),
                    tokenizer.convert_tokens_to_ids("<|endoftext|>")):
            if ids is None:
                continue
            for tid in ids if isinstance(ids, (list, tuple)) else [ids]:
                if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
                    stop.add(tid)
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = getattr(model.generation_config, "pad_token_id", None)
        if pad is None:
            pad = min(stop)

        # generate() fills every unset option from model.generation_config: a clean one keeps the checkpoint's
        # sampling defaults (repetition penalty, top_k...) out of ours. Only the special tokens are kept.
        model.generation_config = GenerationConfig(
            bos_token_id=getattr(model.generation_config, "bos_token_id", None), eos_token_id=sorted(stop),
            pad_token_id=int(pad))
        self.model, self.tokenizer, self.device, self.dtype = model, tokenizer, device, dtype
        self.vision = vision_config_of(self.model_dir)  # None: a text-only model (no image processor)
        self.resize = resize_of(self.vision)
        self.image_token_id = int(image_token_id)
        self.vision_token_ids = set(vision_token_ids(config)) | {self.image_token_id}
        self.stop_token_ids = stop
        self.pad_token_id = int(pad)
        # transformers >= 5 computes M-RoPE positions from per-token modality types; older versions from ids.
        self._wants_mm_token_types = "mm_token_type_ids" in inspect.signature(model.forward).parameters
        log.info("hf: loaded %s (%s) on %s as %s", self.model_dir, type(model).__name__, device, dtype)

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        """Swap in trained weights (a checkpoint of the same model, e.g. from the trainer) in place.

        The swap runs on the model's own thread, between two generate calls: a batch never mixes weights,
        and every reply generated after it carries ``version``.
        """
        if self._executor is None:
            raise PolicyError("hf: backend not started or closed")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load_weights, Path(checkpoint_dir))
        self.version = version

    def _load_weights(self, checkpoint_dir: Path) -> None:
        fresh = type(self.model).from_pretrained(checkpoint_dir, **_dtype_kwarg(self.dtype))
        self.model.load_state_dict(fresh.state_dict())
        log.info("hf: loaded weights from %s", checkpoint_dir)

    async def close(self) -> None:
        """Stop the batcher, fail every pending and in-flight request with PolicyError, free the model."""
        self._closed = True
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await batcher
        error = PolicyError("hf: backend closed")
        for item in [*self._in_flight, *self._pending]:
            if not item.future.done():
                item.future.set_exception(error)
        self._in_flight.clear()
        self._pending.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            # A generate call already running finishes in its thread; its results are dropped.
            executor.shutdown(wait=False, cancel_futures=True)
        self.model = None
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ requests

    async def generate(self, request: ChatRequest) -> Generation:
        """Queue ``request`` for the next batch and wait for its reply.

        Raises :class:`PolicyError` for a request that cannot be run (an image missing or undecodable, a
        prompt without matching image placeholders), a failed generate call, or a closed backend.
        """
        if self._closed or self._batcher is None or self._wakeup is None:
            raise PolicyError("hf: backend not started (or closed)")
        t0 = time.perf_counter()
        try:
            input_ids, images = await asyncio.to_thread(self._prepare, request)
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"hf: request {request.request_id}: {type(exc).__name__}: {exc}") from exc
        if self._closed:
            raise PolicyError("hf: backend closed")
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        now = time.perf_counter()
        self._pending.append(_Item(request, input_ids, images, future, now, (now - t0) * 1000))
        self._wakeup.set()
        return await future

    def _prepare(self, request: ChatRequest) -> tuple[list[int], list[ProcessedImage]]:
        """Prompt ids with each image placeholder expanded to the image's tokens, and the images (any thread).

        The recipe is :func:`policy.prompting.build_prompt_ids`, shared with training's rebuild of a step.
        """
        # One tokenizer, many preparing threads: the Rust tokenizer raises "Already borrowed" if one thread
        # changes its padding/truncation state while another encodes, so calls are serialised (they are short).
        try:
            return build_prompt_ids(self.tokenizer, self.vision, request.messages, request.images,
                                    image_token_id=self.image_token_id, lock=self._tokenizer_lock)
        except PromptError as exc:
            raise PolicyError(f"hf: request {request.request_id}: {exc}") from exc

    # ------------------------------------------------------------------ batching

    async def _batch_loop(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            wait_s = self.batch_wait_ms / 1000.0  # read for each batch: adjustable while running
            # Wait for company, at most batch_wait_ms after the first request queued (counted from its
            # arrival: requests that queued while the previous batch ran do not wait again).
            deadline = self._pending[0].enqueued + wait_s
            while len(self._pending) < self.max_batch:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that comes as the wait ends.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._wakeup.wait()
            batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
            batch = [item for item in batch if not item.future.done()]  # callers that gave up
            if not batch:
                continue
            self.batches_run += 1
            self.requests_batched += len(batch)
            self.batch_sizes.append(len(batch))
            self._in_flight = batch
            groups: dict[tuple[Any, ...], list[_Item]] = {}
            for item in batch:
                groups.setdefault(_group_key(item.request.sampling), []).append(item)
            for group in groups.values():
                if self._executor is None:
                    return
                try:
                    results: list[Generation | PolicyError] = await loop.run_in_executor(
                        self._executor, self._run_group_isolating, group, len(batch))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the executor itself failed (shut down): never leave callers hanging
                    results = [self._as_policy_error(item, exc) for item in group]
                for item, result in zip(group, results, strict=True):
                    if item.future.done():
                        continue
                    if isinstance(result, BaseException):
                        self.requests_failed += 1
                        item.future.set_exception(result)
                    else:
                        item.future.set_result(result)
            self._in_flight = []

    def _run_group_isolating(self, group: list[_Item], batch_size: int) -> list[Generation | PolicyError]:
        """Run a group; if its generate call fails, run its requests one by one so only the culprit fails."""
        try:
            return list(self._run_group(group, batch_size))
        except Exception as exc:
            if len(group) == 1:
                return [self._as_policy_error(group[0], exc)]
            log.warning("hf: batch of %d failed (%s: %s); retrying one by one", len(group), type(exc).__name__, exc)
            self._free_device_memory()
        results: list[Generation | PolicyError] = []
        for item in group:
            try:
                results.extend(self._run_group([item], batch_size))
            except Exception as exc:
                results.append(self._as_policy_error(item, exc))
        return results

    @staticmethod
    def _as_policy_error(item: _Item, exc: BaseException) -> PolicyError:
        err = PolicyError(f"hf: request {item.request.request_id}: generate failed: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err

    def _free_device_memory(self) -> None:
        with contextlib.suppress(Exception):
            import torch

            if self.device is not None and self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _run_group(self, group: Sequence[_Item], batch_size: int) -> list[Generation]:
        """One model.generate call for requests with the same sampling parameters (model thread)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        start = time.perf_counter()
        model = self.model
        if model is None:
            raise PolicyError("hf: backend closed")
        sampling = group[0].request.sampling
        max_new = max(max(1, int(item.request.sampling.max_tokens)) for item in group)

        # Left padding: every prompt ends at the same column, where generation starts.
        width = max(len(item.input_ids) for item in group)
        input_ids = torch.full((len(group), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, item in enumerate(group):
            n = len(item.input_ids)
            input_ids[row, width - n:] = torch.tensor(item.input_ids, dtype=torch.long)
            attention_mask[row, width - n:] = 1
        inputs: dict[str, Any] = {"input_ids": input_ids.to(self.device),
                                  "attention_mask": attention_mask.to(self.device)}
        images = [image for item in group for image in item.images]
        if images:
            pixel_values, grid_thw = stack_images(images)
            inputs["pixel_values"] = torch.from_numpy(pixel_values).to(self.device, dtype=self.dtype)
            inputs["image_grid_thw"] = torch.from_numpy(grid_thw).to(self.device)
        if self._wants_mm_token_types:
            inputs["mm_token_type_ids"] = (input_ids == self.image_token_id).to(torch.int32).to(self.device)

        greedy = sampling.temperature <= 0
        # One recorder per group: the group shares one temperature (it is part of the group key).
        tempered = self.logprobs_of == "temperature" and not greedy
        recorder = _LogprobRecorder(float(sampling.temperature) if tempered else 1.0)
        logprobs_of = "temperature" if tempered else "model"
        processors = LogitsProcessorList()
        if self.vision_in_logprobs:
            processors.append(recorder)
        if self.vision_token_ids:
            from transformers import SuppressTokensLogitsProcessor

            # A reply never contains vision placeholders (a random model would emit them); one in a reply would
            # also be taken for an image when the step is trained on.
            processors.append(SuppressTokensLogitsProcessor(sorted(self.vision_token_ids), device=self.device))
        # The recorder sees the model's own distribution: before the warpers (the module docstring says why).
        if not self.vision_in_logprobs:
            processors.append(recorder)
        if not greedy:
            from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

            # Our own warpers, in vLLM's order: transformers puts custom processors before its built-in warpers.
            if sampling.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(float(sampling.temperature)))
            if sampling.top_k:
                processors.append(TopKLogitsWarper(int(sampling.top_k)))
            if sampling.top_p < 1.0:
                processors.append(TopPLogitsWarper(float(sampling.top_p)))
        # Sampling: our warpers above do the work; the built-in ones are set to no-ops (top_k=0 disables).
        options: dict[str, Any] = {} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        gen_config = GenerationConfig(
            do_sample=not greedy, max_new_tokens=max_new, eos_token_id=sorted(self.stop_token_ids),
            pad_token_id=self.pad_token_id, bos_token_id=model.generation_config.bos_token_id, use_cache=True,
            **options,
        )
        seeds = [item.request.sampling.seed for item in group if item.request.sampling.seed is not None]
        if seeds and not greedy:
            torch.manual_seed(int(seeds[0]))
        with torch.inference_mode():
            out = model.generate(**inputs, generation_config=gen_config, logits_processor=processors)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        generated = sequences[:, width:]
        logprobs = recorder.finish(generated)  # (rows, steps) float32 on CPU
        generate_ms = (time.perf_counter() - start) * 1000
        self.generate_calls += 1

        results: list[Generation] = []
        gen_rows = generated.cpu().tolist()
        for row, item in enumerate(group):
            limit = max(1, int(item.request.sampling.max_tokens))
            tokens = gen_rows[row][:limit]
            finish = "length"
            for i, tid in enumerate(tokens):
                if tid in self.stop_token_ids:
                    tokens = tokens[:i + 1]
                    finish = "stop"
                    break
            # Cut at our own limit: when the batch ran longer, the first `limit` tokens are what a run of
            # `limit` tokens would have produced.
            lps = [float(x) for x in logprobs[row, :len(tokens)]]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(Generation(
                text=text, token_ids=tokens, logprobs=lps if item.request.sampling.logprobs else None,
                logprobs_of=logprobs_of if item.request.sampling.logprobs else None,
                logprobs_vision_masked=bool(self.vision_token_ids) and not self.vision_in_logprobs,
                prompt_tokens=len(item.input_ids), finish_reason=finish,
                prompt_sha256=prompt_sha256(item.input_ids), policy_version=self.version,
                timings_ms={"queue_ms": (start - item.enqueued) * 1000, "prep_ms": item.prep_ms,
                            "batch_size": float(batch_size), "group_size": float(len(group)),
                            "generate_ms": generate_ms},
            ))
        return results


def _dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """``from_pretrained``'s dtype argument (transformers renamed torch_dtype to dtype in 4.56)."""
    import transformers

    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if major_minor >= (4, 56) else "torch_dtype": dtype}


class _LogprobRecorder:
    """A logits processor (before the warpers) that records the log-probability of each chosen token, under
    ``log_softmax(scores / temperature)`` (1: the model's own distribution).

    It sees the final scores of step ``i``; the token chosen from them appears as the last column of
    ``input_ids`` at step ``i + 1`` (and in the output for the last step), so only one step's
    log-softmax is kept at a time instead of transformers' ``output_scores`` (steps x batch x vocab).
    """

    def __init__(self, temperature: float = 1.0) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, not {temperature}")
        self.temperature = float(temperature)
        self._prev: Any = None  # log_softmax of the previous step's scores, (rows, vocab) float32
        self._out: list[Any] = []  # (rows,) per step

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self._prev is not None:
            self._out.append(self._prev.gather(1, input_ids[:, -1:]).squeeze(1))
        scores32 = scores.float()
        if self.temperature != 1.0:
            scores32 = scores32 / self.temperature  # in float32, as the trainer divides its float32 logits
        self._prev = torch.log_softmax(scores32, dim=-1)
        return scores

    def finish(self, generated: Any) -> np.ndarray:
        """Log-probabilities ``(rows, generated tokens)`` after generate returned ``generated`` (new tokens)."""
        import torch

        if self._prev is not None and generated.shape[1] > len(self._out):
            self._out.append(self._prev.gather(1, generated[:, len(self._out):len(self._out) + 1]).squeeze(1))
        self._prev = None
        if not self._out:
            return np.zeros((generated.shape[0], 0), dtype=np.float32)
        return torch.stack(self._out, dim=1).cpu().numpy()
