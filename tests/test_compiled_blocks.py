"""``torch.compile`` of a Qwen-VL model's repeated blocks (``policy.compiled_blocks``): a training step's loss and
gradients equal the eager model's, with the varlen vision attention, without checkpointing and with every layer
checkpointed, and the only graph breaks are the attention layout's. The graphs are captured with the ``aot_eager``
backend (TorchDynamo and AOTAutograd, as with inductor, without generating kernels: inductor's code generation is
what ``bench.train_step --compile`` measures on a GPU)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.train_step import qwen25_vl_3b_config, synthetic_batch  # noqa: E402
from policy.compiled_blocks import RECOMPILE_LIMIT, repeated_blocks, set_compiled_blocks  # noqa: E402
from policy.vision_attention import set_vision_attention  # noqa: E402
from train.logprobs import label_logprobs  # noqa: E402
from train.model_inputs import model_wants_mm_token_types  # noqa: E402
from train.model_io import set_checkpointing  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Any:
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration._from_config(qwen25_vl_3b_config(tiny=True), dtype=torch.float32)
    model.train()
    set_vision_attention(model, "varlen")
    return model


def _step(model: Any, batch: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    logp, _, _, _ = label_logprobs(model, batch, torch.device("cpu"))
    loss = -logp.mean()
    loss.backward()
    return loss.item(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def test_compiled_blocks_give_the_eager_loss_and_gradients(model: Any) -> None:
    import torch._dynamo

    # Two screenshots of 252x224 pixels: windows of 64 and of 32 patches in the windowed blocks (the padded layout).
    batch = synthetic_batch(1, 600, 2, 224, 252, 16, mm_token_types=model_wants_mm_token_types(model))
    vision, language = repeated_blocks(model)
    assert len(vision) == 2 and len(language) == 2
    # Checkpointing every layer covers both ways a block is compiled under it: vision blocks part by part, decoder
    # layers whole.
    for checkpointing in (False, True):
        set_checkpointing(model, checkpointing)
        assert set_compiled_blocks(model, "off") == 0
        eager_loss, eager = _step(model, batch)
        assert set_compiled_blocks(model, "all", backend="aot_eager") == 4
        # A checkpointed vision block is compiled part by part; the others (decoder layers too) whole.
        for block in vision + language:
            down = bool(checkpointing) and block in vision
            assert (block._compiled_call_impl is None) == down
            assert all((child._compiled_call_impl is not None) == down for child in block.children())
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        loss, grads = _step(model, batch)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # the blocks did run compiled
        breaks = list(torch._dynamo.utils.counters["graph_break"])
        assert breaks and all("_layout" in reason for reason in breaks), breaks
        assert loss == pytest.approx(eager_loss, abs=TOL)
        assert grads.keys() == eager.keys()
        for k in eager:
            assert torch.allclose(grads[k], eager[k], rtol=TOL, atol=TOL), k
    set_checkpointing(model, False)


def test_modes_compile_the_blocks_they_name_and_off_restores_eager(model: Any) -> None:
    import torch._dynamo

    vision, language = repeated_blocks(model)
    assert set_compiled_blocks(model, "vision", backend="aot_eager") == len(vision)
    assert all(b._compiled_call_impl is not None for b in vision)
    assert all(layer._compiled_call_impl is None for layer in language)
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT  # the blocks share one wrapper's code
    assert set_compiled_blocks(model, "off") == 0
    assert all(b._compiled_call_impl is None for b in vision + language)
    with pytest.raises(ValueError, match="compile must be one of off, vision, all"):
        set_compiled_blocks(model, "everything")
