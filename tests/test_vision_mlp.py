"""The aligned vision MLP (``policy.vision_mlp``) against transformers' own on a tiny random Qwen2.5-VL tower whose
MLP is 60 wide (not a multiple of 8, like the released models' 3,420): same outputs and gradients, the
parameters' shapes untouched, and a switch back to transformers' forward."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from policy.tiny_models import build_tiny_model  # noqa: E402
from policy.vision_attention import vision_towers  # noqa: E402
from policy.vision_mlp import set_vision_mlp  # noqa: E402
from train.model_io import load_model  # noqa: E402

TOL = 1e-5
GRID = [[1, 8, 12], [1, 20, 14]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tiny_vision_mlp")
    return {
        "qwen2_5_vl": load_model(build_tiny_model(root / "q25", "qwen2_5_vl", vision={"intermediate_size": 60})),
        "qwen2_vl": load_model(build_tiny_model(root / "q2", "qwen2_vl")),
    }


def _tower_pass(model: Any, mode: str) -> tuple[Any, dict[str, Any]]:
    """The tower's merged output for two images, and the gradients of a loss on it w.r.t. its weights."""
    set_vision_mlp(model, mode)
    tower = vision_towers(model)[0]
    tower.zero_grad(set_to_none=True)
    vc = model.config.vision_config
    n = sum(t * h * w for t, h, w in GRID)
    pixels = torch.randn(n, vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2,
                         generator=torch.Generator().manual_seed(0))
    out = tower(pixels, grid_thw=torch.tensor(GRID))
    merged = out.pooler_output if hasattr(out, "pooler_output") else out[0]
    (merged * torch.linspace(-1.0, 1.0, merged.numel()).reshape(merged.shape)).sum().backward()
    return merged.detach(), {k: p.grad.detach().clone() for k, p in tower.named_parameters() if p.grad is not None}


def test_the_padded_mlp_gives_the_outputs_and_gradients_of_transformers_own(models: dict[str, Any]) -> None:
    model = models["qwen2_5_vl"]
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    ref_out, ref_grads = _tower_pass(model, "default")
    out, grads = _tower_pass(model, "aligned")
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    assert grads.keys() == ref_grads.keys() and any("mlp.gate_proj" in k for k in grads)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=TOL, rtol=0, msg=k)
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes  # checkpoints keep their shapes


def test_every_misaligned_block_is_padded_and_default_restores_transformers_forward(models: dict[str, Any]) -> None:
    model = models["qwen2_5_vl"]
    blocks = vision_towers(model)[0].blocks
    assert set_vision_mlp(model, "aligned") == len(blocks)
    assert all("forward" in b.mlp.__dict__ for b in blocks)
    assert set_vision_mlp(model, "default") == 0
    assert not any("forward" in b.mlp.__dict__ for b in blocks)
    with pytest.raises(ValueError, match="vision_mlp must be one of aligned, default"):
        set_vision_mlp(model, "padded")


def test_towers_without_a_gated_mlp_are_left_as_they_are(models: dict[str, Any]) -> None:
    assert set_vision_mlp(models["qwen2_vl"], "aligned") == 0  # fc1/fc2, 4 x the width: aligned already
