"""The in-process transformers backend (``policy.hf_backend``) on tiny random Qwen2-VL / Qwen3-VL models built
offline (``policy.tiny_models``), and its image preprocessing (``policy.vision``) against transformers' own."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine import _imgcodec as codec  # noqa: E402
from engine.agent.model_api import ChatRequest, Generation, SamplingParams  # noqa: E402
from engine.agent.policy_api import PolicyError  # noqa: E402
from policy.hf_backend import HFModel  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from policy.vision import VisionConfig, load_vision_config, preprocess_jpeg, resize_for_model  # noqa: E402

ARCHS = ("qwen2_vl", "qwen3_vl")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random qwen2_vl and qwen3_vl model directories (built offline, about 0.1 s each once imported)."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: build_tiny_model(root / arch, arch, seed=0) for arch in ARCHS}


@pytest_asyncio.fixture(scope="session")
async def hf_models(tiny_models: dict[str, Path]) -> AsyncIterator[dict[str, HFModel]]:
    """A started HFModel per arch, batches of up to 8; on CPU (``WEBGYM_HF_TEST_DEVICE=cuda`` for a GPU), float32
    so that batched and single greedy replies can be compared closely."""
    device = os.environ.get("WEBGYM_HF_TEST_DEVICE", "cpu")
    models = {arch: HFModel(path, device=device, dtype="float32", max_batch=8, batch_wait_ms=5.0)
              for arch, path in tiny_models.items()}
    for model in models.values():
        await model.start()
    yield models
    for model in models.values():
        await model.close()


def screenshot(width: int = 320, height: int = 200, variant: int = 0) -> bytes:
    """A synthetic web page screenshot (header bar, text lines, buttons, an image block) as JPEG bytes."""
    rng = np.random.default_rng(variant)
    img = np.full((height, width, 3), 248, np.uint8)
    img[: height // 8] = (30, 60, 140)  # header bar
    for row in range(height // 8 + 6, height - 10, 9):  # "text" lines of dark dashes
        x = 8
        while x < width * 2 // 3:
            word = int(rng.integers(6, 30))
            img[row: row + 5, x: min(x + word, width)] = 40
            x += word + 5
    bx = int(rng.integers(10, width // 2))
    img[height // 2: height // 2 + 20, bx: bx + 70] = (200, 40 + 20 * variant % 200, 40)  # a button
    img[height // 4: height // 4 + 60, width - 110: width - 10] = rng.integers(0, 256, (60, 100, 3), dtype=np.uint8)
    return codec.encode(img, 85)


def chat(idx: int, n_images: int = 1, text: str = "Click the search button.", *,
         sampling: SamplingParams | None = None, bad_image: bool = False) -> ChatRequest:
    """A two-message agent chat with ``n_images`` screenshots."""
    parts: list[dict] = [{"type": "text", "text": f"Task {idx}: {text}"}]
    images: dict[str, bytes] = {}
    for k in range(n_images):
        ref = f"ep{idx}/{k:03d}.jpg"
        parts.append({"type": "text", "text": f"Step {k}:"})
        parts.append({"type": "image", "image": ref})
        images[ref] = b"\xff\xd8\xff\xe0 not really a jpeg" if bad_image else screenshot(variant=idx + k)
    messages = [{"role": "system", "content": "You are a web agent. Answer with one action."},
                {"role": "user", "content": parts}]
    return ChatRequest(f"req-{idx}", messages, images, sampling or SamplingParams(temperature=0.0, max_tokens=8))


def check_generation(gen: Generation, max_tokens: int) -> None:
    assert isinstance(gen, Generation)
    assert gen.token_ids is not None and gen.logprobs is not None
    assert 1 <= len(gen.token_ids) == len(gen.logprobs) <= max_tokens
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in gen.logprobs)
    assert gen.finish_reason in ("stop", "length")
    if gen.finish_reason == "length":
        assert len(gen.token_ids) == max_tokens
    assert {"queue_ms", "batch_size", "generate_ms"} <= gen.timings_ms.keys()


# ---------------------------------------------------------------------------------------------- tiny models


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_directory(tiny_models: dict[str, Path], arch: str) -> None:
    from transformers import AutoTokenizer

    path = tiny_models[arch]
    config = json.loads((path / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(path)
    assert config["image_token_id"] == tok.convert_tokens_to_ids("<|image_pad|>")
    assert config["vision_start_token_id"] == tok.convert_tokens_to_ids("<|vision_start|>")
    assert config["vision_config"]["patch_size"] == (16 if arch == "qwen3_vl" else 14)
    assert config["vision_config"]["spatial_merge_size"] == 2
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image", "image": "x.jpg"}, {"type": "text", "text": "hi"}]}],
        tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"
                      "<|im_start|>assistant\n")
    ids = tok('<think>ok</think><tool_call>{"a": 1}</tool_call><|im_end|>', add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == '<think>ok</think><tool_call>{"a": 1}</tool_call>'
    vision = load_vision_config(path)
    assert vision.factor == (32 if arch == "qwen3_vl" else 28)


# ---------------------------------------------------------------------------------------------- vision


@pytest.mark.parametrize("preset", ["tiny_qwen2_vl", "tiny_qwen3_vl", "qwen2_vl", "qwen3_vl"])
def test_vision_matches_transformers(tiny_models: dict[str, Path], preset: str) -> None:
    """Same resized RGB in, same pixel_values and image_grid_thw out as transformers' Qwen2VL image processor."""
    try:  # transformers >= 5: the PIL/numpy processor has its own module (the default one needs torchvision)
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as Processor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    except ImportError:  # transformers 4.x: the default (slow) processor is the numpy one
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor as Processor
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    if preset.startswith("tiny_"):
        cfg = load_vision_config(tiny_models[preset.removeprefix("tiny_")])
        jpeg = screenshot(320, 200, variant=3)
    elif preset == "qwen2_vl":
        cfg = VisionConfig()  # the released Qwen2-VL / Qwen2.5-VL settings
        jpeg = screenshot(1280, 720, variant=4)
    else:
        cfg = VisionConfig(patch_size=16, min_pixels=codec.QWEN3_VL["min_pixels"],
                           max_pixels=codec.QWEN3_VL["max_pixels"], image_mean=(0.5, 0.5, 0.5),
                           image_std=(0.5, 0.5, 0.5))
        jpeg = screenshot(1280, 720, variant=5)
    ref = Processor(
        min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels, patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size, merge_size=cfg.merge_size,
        image_mean=list(cfg.image_mean), image_std=list(cfg.image_std))

    width, height = codec.jpeg_size(jpeg)
    rgb = resize_for_model(jpeg, cfg)
    assert rgb.shape[:2] == smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    ours = preprocess_jpeg(jpeg, cfg)
    theirs = ref(images=[rgb], do_resize=False, return_tensors="np")
    assert ours.pixel_values.dtype == np.float32
    assert ours.pixel_values.shape == theirs["pixel_values"].shape
    np.testing.assert_allclose(ours.pixel_values, theirs["pixel_values"], rtol=0, atol=1e-5)
    assert [list(ours.grid_thw)] == theirs["image_grid_thw"].tolist()
    t, h, w = ours.grid_thw
    assert ours.num_tokens == t * h * w // cfg.merge_size**2


# ---------------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n_images", [1, 2])
async def test_generate_with_images(hf_models: dict[str, HFModel], arch: str, n_images: int) -> None:
    model = hf_models[arch]
    request = chat(1, n_images, sampling=SamplingParams(temperature=1.0, max_tokens=8, seed=3))
    gen = await model.generate(request)
    check_generation(gen, 8)
    # Each 320x200 screenshot becomes 6x10 patches -> 15 tokens in place of its one <|image_pad|>.
    per_image = preprocess_jpeg(screenshot(variant=1), model.vision).num_tokens  # type: ignore[arg-type]
    assert per_image == 15
    text = model.tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True)
    assert text.count("<|image_pad|>") == n_images
    n_ids = len(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert gen.prompt_tokens == n_ids + n_images * (per_image - 1)


async def test_eight_concurrent_requests_run_in_one_batch(hf_models: dict[str, HFModel]) -> None:
    model = hf_models["qwen2_vl"]
    before_batches, before_calls = model.batches_run, model.generate_calls
    model.batch_wait_ms = 2000.0  # the batch starts when the 8th request arrives, long before this
    try:
        sampling = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=i) for i in range(8)]
        gens = await asyncio.gather(*[model.generate(chat(i, 1 + i % 2, "x" * (3 * i), sampling=s))
                                      for i, s in enumerate(sampling)])
    finally:
        model.batch_wait_ms = 5.0
    assert model.batches_run - before_batches == 1
    assert model.generate_calls - before_calls == 1
    assert model.batch_sizes[-1] == 8
    for gen in gens:
        check_generation(gen, 12)
        assert gen.timings_ms["batch_size"] == 8


@pytest.mark.parametrize("arch", ARCHS)
async def test_greedy_batch_equals_single(hf_models: dict[str, HFModel], arch: str) -> None:
    """Left padding is right: a greedy reply is the same alone and in a batch of prompts of other lengths."""
    model = hf_models[arch]
    requests = [chat(i, 1 + i % 2, "find the cheapest laptop " * i, sampling=SamplingParams(temperature=0.0,
                                                                                            max_tokens=10))
                for i in range(4)]
    model.batch_wait_ms = 2000.0
    try:
        calls = model.generate_calls
        batched = await asyncio.gather(*[model.generate(r) for r in requests[:4]], *[
            model.generate(r) for r in requests[:4]])  # 8 = max_batch: starts at once
        assert model.generate_calls - calls == 1
    finally:
        model.batch_wait_ms = 5.0
    singles = [await model.generate(r) for r in requests]
    assert len({g.prompt_tokens for g in singles}) == 4  # really different prompt lengths
    for i, single in enumerate(singles):
        check_generation(single, 10)
        for gen in (batched[i], batched[i + 4]):
            assert gen.token_ids == single.token_ids
            assert gen.text == single.text
            np.testing.assert_allclose(gen.logprobs, single.logprobs, atol=1e-4)  # type: ignore[arg-type]


async def test_seeded_sampling_is_reproducible(hf_models: dict[str, HFModel]) -> None:
    model = hf_models["qwen3_vl"]
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=8, seed=1234)
    first = await model.generate(chat(7, sampling=sampling))
    second = await model.generate(chat(7, sampling=sampling))
    assert first.token_ids == second.token_ids
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-5)


async def test_max_tokens_respected(hf_models: dict[str, HFModel]) -> None:
    """Each request stops at its own max_tokens, also when batched with a longer one."""
    model = hf_models["qwen2_vl"]
    short = chat(2, sampling=SamplingParams(temperature=0.0, max_tokens=3))
    long = chat(2, sampling=SamplingParams(temperature=0.0, max_tokens=9))
    model.batch_wait_ms = 2000.0  # both queue within it even on a loaded machine
    try:
        calls = model.generate_calls
        g_short, g_long = await asyncio.gather(model.generate(short), model.generate(long))
        assert model.generate_calls - calls == 1
    finally:
        model.batch_wait_ms = 5.0
    assert g_long.token_ids is not None and g_short.token_ids is not None
    assert g_long.finish_reason == "length" and len(g_long.token_ids) == 9  # the tiny model never says <|im_end|>
    assert g_short.finish_reason == "length" and len(g_short.token_ids) == 3
    assert g_short.token_ids == g_long.token_ids[:3]
    assert g_short.logprobs == pytest.approx(g_long.logprobs[:3], abs=1e-5)  # type: ignore[index]


@pytest.mark.parametrize("arch", ARCHS)
async def test_broken_image_fails_only_its_request(hf_models: dict[str, HFModel], arch: str) -> None:
    model = hf_models[arch]
    results = await asyncio.gather(model.generate(chat(1)), model.generate(chat(2, 2, bad_image=True)),
                                   model.generate(chat(3)), return_exceptions=True)
    assert isinstance(results[1], PolicyError)
    assert "ep2/000.jpg" in str(results[1])
    check_generation(results[0], 8)  # type: ignore[arg-type]
    check_generation(results[2], 8)  # type: ignore[arg-type]
    missing = chat(4)
    missing.images = {}
    with pytest.raises(PolicyError, match="no bytes for image"):
        await model.generate(missing)


async def test_close_fails_pending_requests(tiny_models: dict[str, Path]) -> None:
    model = HFModel(tiny_models["qwen2_vl"], device="cpu", max_batch=8, batch_wait_ms=10_000.0)
    await model.start()
    tasks = [asyncio.create_task(model.generate(chat(i))) for i in range(3)]
    deadline = time.perf_counter() + 10
    while len(model._pending) < 3 and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    await model.close()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        assert isinstance(result, PolicyError)
    with pytest.raises(PolicyError):
        await model.generate(chat(9))


async def test_close_returns_when_the_batcher_is_woken_as_it_is_cancelled(tiny_models: dict[str, Path]) -> None:
    # Python 3.11's asyncio.wait_for returns the inner result when its task is cancelled just as that inner wait
    # ends: a batcher waiting that way for company lost close()'s cancel and kept waiting, so close() never returned.
    model = HFModel(tiny_models["qwen2_vl"], device="cpu", max_batch=8, batch_wait_ms=10_000.0)
    await model.start()
    task = asyncio.create_task(model.generate(chat(0)))
    while not model._pending:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the batcher waits for company
    assert model._wakeup is not None
    model._wakeup.set()  # its wait ends in the same turn of the loop as the cancel below
    closing = asyncio.create_task(model.close())
    done, _ = await asyncio.wait([closing], timeout=5)
    assert done, "close() did not return"
    with pytest.raises(PolicyError, match="closed"):
        await task


async def test_failed_generate_fails_only_the_culprit(hf_models: dict[str, HFModel],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A generate call that fails (OOM, bad input) is retried request by request: only the culprit fails."""
    model = hf_models["qwen3_vl"]
    real_run_group = model._run_group

    def run_group(group, batch_size):  # type: ignore[no-untyped-def]
        if any(item.request.request_id == "req-66" for item in group):
            raise RuntimeError("CUDA out of memory (simulated)")
        return real_run_group(group, batch_size)

    monkeypatch.setattr(model, "_run_group", run_group)
    model.batch_wait_ms = 2000.0
    try:
        failed = model.requests_failed
        results = await asyncio.gather(*[model.generate(chat(i)) for i in range(64, 72)], return_exceptions=True)
    finally:
        model.batch_wait_ms = 5.0
    assert isinstance(results[2], PolicyError) and "out of memory" in str(results[2])
    for i, result in enumerate(results):
        if i != 2:
            check_generation(result, 8)  # type: ignore[arg-type]
    assert model.requests_failed - failed == 1


def test_logprobs_of_option(tiny_models: dict[str, Path]) -> None:
    """Log-probs under the model's own distribution or after the temperature (SGLang's default); nothing else."""
    assert HFModel(tiny_models["qwen2_vl"], device="cpu").logprobs_of == "model"
    assert HFModel(tiny_models["qwen2_vl"], device="cpu", logprobs_of="temperature").logprobs_of == "temperature"
    with pytest.raises(ValueError, match="logprobs_of must be one of model, temperature, not 'sampler'"):
        HFModel(tiny_models["qwen2_vl"], device="cpu", logprobs_of="sampler")
