"""The varlen vision attention (``policy.vision_attention``) against transformers' own, on tiny random Qwen2-VL,
Qwen2.5-VL and Qwen3-VL models built offline: same outputs and gradients, one attention call per block, the
language model's attention untouched, and the ``hf`` backend's greedy replies unchanged."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.agent.model_api import ChatRequest, SamplingParams  # noqa: E402
from policy.hf_backend import HFModel  # noqa: E402
from policy.tiny_models import ARCHS, build_tiny_model  # noqa: E402
from policy.varlen_attention import varlen_attention_forward  # noqa: E402
from policy.vision_attention import VARLEN_IMPLEMENTATION, set_vision_attention, vision_towers  # noqa: E402
from train.model_io import load_model, write_checkpoint  # noqa: E402

TOL = 1e-5
#: Several images of different sizes in one batch (patch grids T, H, W): windows of two sizes in Qwen2.5-VL and
#: images of three lengths everywhere; and two images of one size (the unpadded path).
GRIDS = {"mixed": [[1, 8, 12], [1, 20, 14], [1, 6, 6]], "alike": [[1, 12, 16], [1, 12, 16]]}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_vision_attention")
    return {arch: build_tiny_model(root / arch, arch, seed=0) for arch in ARCHS}


@pytest.fixture(scope="module")
def tiny_loaded(tiny_dirs: dict[str, Path]) -> dict[str, Any]:
    return {arch: load_model(path, vision_attention="default") for arch, path in tiny_dirs.items()}


def _pixels(model: Any, grid: list[list[int]], seed: int = 0) -> Any:
    vc = model.config.vision_config
    n = sum(t * h * w for t, h, w in grid)
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))


def _tower_pass(model: Any, mode: str, pixels: Any, grid: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The vision tower's merged output, and the gradients of a loss on it w.r.t. the pixels and its weights."""
    set_vision_attention(model, mode)
    tower = vision_towers(model)[0]
    tower.zero_grad(set_to_none=True)
    px = pixels.clone().requires_grad_(True)
    out = tower(px, grid_thw=grid)
    merged = out.pooler_output if hasattr(out, "pooler_output") else out[0]
    weights = torch.linspace(-1.0, 1.0, merged.numel()).reshape(merged.shape)  # a loss that weighs every output
    (merged * weights).sum().backward()
    grads = {k: p.grad.detach().clone() for k, p in tower.named_parameters() if p.grad is not None}
    return merged.detach(), px.grad.detach(), grads


@pytest.mark.parametrize("grids", list(GRIDS))
@pytest.mark.parametrize("arch", ARCHS)
def test_tower_outputs_and_gradients_match(tiny_loaded: dict[str, Any], arch: str, grids: str) -> None:
    model = tiny_loaded[arch]
    grid = torch.tensor(GRIDS[grids])
    pixels = _pixels(model, GRIDS[grids])
    ref_out, ref_px, ref_w = _tower_pass(model, "default", pixels, grid)
    out, px, w = _tower_pass(model, "varlen", pixels, grid)
    assert vision_towers(model)[0].config._attn_implementation == VARLEN_IMPLEMENTATION
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(px, ref_px, atol=TOL, rtol=0)
    assert w.keys() == ref_w.keys() and any("attn" in k for k in w)
    for k in ref_w:
        torch.testing.assert_close(w[k], ref_w[k], atol=TOL, rtol=0, msg=k)
    assert ref_px.abs().max() > 1e-3  # the comparison is not of zeros


@pytest.mark.parametrize("arch", ARCHS)
def test_one_attention_call_per_block(tiny_loaded: dict[str, Any], arch: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_loaded[arch]
    tower = vision_towers(model)[0]
    calls = {"n": 0}
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    grid = torch.tensor(GRIDS["mixed"])
    pixels = _pixels(model, GRIDS["mixed"])
    counts = {}
    for mode in ("default", "varlen"):
        set_vision_attention(model, mode)
        calls["n"] = 0
        with torch.no_grad():
            tower(pixels, grid_thw=grid)
        counts[mode] = calls["n"]
    depth = model.config.vision_config.depth
    assert counts["varlen"] == depth
    assert counts["default"] > 2 * depth  # transformers' loop: one call per image or window


def test_language_model_keeps_its_attention(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    model = load_model(tiny_dirs["qwen2_5_vl"])  # the default: varlen
    assert model.config.vision_config._attn_implementation == VARLEN_IMPLEMENTATION
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "sdpa"
    set_vision_attention(model, "default")
    assert model.config.vision_config._attn_implementation == "sdpa"
    eager = load_model(tiny_dirs["qwen2_vl"], attn_implementation="eager", vision_attention="varlen")
    assert eager.config.text_config._attn_implementation == "eager"
    assert eager.config.vision_config._attn_implementation == VARLEN_IMPLEMENTATION
    # A checkpoint does not carry the name: vLLM and a plain from_pretrained load it as they would.
    write_checkpoint(model.train(), model.state_dict(), tmp_path / "ckpt", class_name=type(model).__name__,
                     dtype=torch.float32, source_dir=tiny_dirs["qwen2_5_vl"])
    assert VARLEN_IMPLEMENTATION not in (tmp_path / "ckpt" / "config.json").read_text()
    with pytest.raises(ValueError, match="vision_attention"):
        set_vision_attention(model, "fast")


def test_full_model_logits_match(tiny_loaded: dict[str, Any]) -> None:
    """The whole model (images in the language model's input) as the trainer runs it, on Qwen2.5-VL."""
    model = tiny_loaded["qwen2_5_vl"]
    cfg = model.config
    grid = GRIDS["mixed"]
    per_image = [t * h * w // 4 for t, h, w in grid]
    ids: list[int] = [5, 6]
    for n in per_image:
        ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * n + [cfg.vision_end_token_id, 7]
    input_ids = torch.tensor([ids])
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
             "pixel_values": _pixels(model, grid), "image_grid_thw": torch.tensor(grid),
             "mm_token_type_ids": (input_ids == cfg.image_token_id).to(torch.int32)}
    logits = {}
    for mode in ("default", "varlen"):
        set_vision_attention(model, mode)
        with torch.no_grad():
            logits[mode] = model(**batch).logits
    torch.testing.assert_close(logits["varlen"], logits["default"], atol=TOL, rtol=0)


def test_function_on_uneven_chunks() -> None:
    """The function alone, against SDPA chunk by chunk: chunks of several lengths, an empty one, gradients."""
    gen = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 5, 5, 12, 13, 20], dtype=torch.int32)  # lengths 5, 0, 7, 1, 7
    q, k, v = (torch.randn(1, 2, 20, 8, generator=gen, requires_grad=True) for _ in range(3))
    out, _ = varlen_attention_forward(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                      max_length_q=7, max_length_k=7)
    bounds = cu.tolist()
    ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], scale=0.3) for a, b in itertools.pairwise(bounds) if b > a], dim=2)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=TOL, rtol=0)
    g_out = torch.autograd.grad((out * out).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * ref).sum(), (q, k, v))
    for a, b in zip(g_out, g_ref, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def _request(idx: int, images: dict[str, bytes]) -> ChatRequest:
    parts: list[dict[str, Any]] = [{"type": "text", "text": f"Task {idx}: click the search button."}]
    for ref in images:
        parts += [{"type": "text", "text": "Screenshot:"}, {"type": "image", "image": ref}]
    return ChatRequest(f"va-{idx}", [{"role": "user", "content": parts}], images,
                       SamplingParams(temperature=0.0, max_tokens=8))


@pytest.mark.parametrize("arch", ARCHS)
async def test_hf_backend_greedy_replies_unchanged(tiny_dirs: dict[str, Path], arch: str) -> None:
    from tests.test_hf_backend import screenshot

    # Screenshots of three sizes, one to three per request: several images of different sizes in each batch.
    sizes = [(320, 200), (256, 256), (200, 320)]
    requests = [_request(i, {f"r{i}/{j}.jpg": screenshot(*sizes[(i + j) % 3], variant=i + j)
                             for j in range(1 + i % 3)}) for i in range(4)]

    async def replies(mode: str) -> list[tuple[list[int], list[float]]]:
        model = HFModel(tiny_dirs[arch], device="cpu", dtype="float32", max_batch=4, batch_wait_ms=2000.0,
                        vision_attention=mode)
        await model.start()
        try:
            assert model.model.config.vision_config._attn_implementation == (
                VARLEN_IMPLEMENTATION if mode == "varlen" else "sdpa")
            gens = await asyncio.gather(*[model.generate(r) for r in requests])
            assert model.generate_calls == 1
        finally:
            await model.close()
        return [(g.token_ids, g.logprobs) for g in gens]

    base, fast = await replies("default"), await replies("varlen")
    for (ids_b, lp_b), (ids_f, lp_f) in zip(base, fast, strict=True):
        assert ids_f == ids_b
        torch.testing.assert_close(torch.tensor(lp_f), torch.tensor(lp_b), atol=TOL, rtol=0)


def test_config_setting(tiny_dirs: dict[str, Path]) -> None:
    from train.config import ConfigError, TrainConfig

    assert TrainConfig(model_dir=str(tiny_dirs["qwen2_vl"])).vision_attention == "varlen"
    with pytest.raises(ConfigError, match="vision_attention"):
        TrainConfig.from_dict({"model_dir": "m", "vision_attention": "flex"})
    with pytest.raises(ValueError, match="vision_attention"):
        HFModel(tiny_dirs["qwen2_vl"], vision_attention="flex")
    assert json.loads(json.dumps(TrainConfig(model_dir="m").to_dict()))["vision_attention"] == "varlen"
