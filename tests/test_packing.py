"""Sequence packing (``train.packing``): a packed micro-batch (one row, no padding, positions and attention per
sample) gives the losses and gradients of the padded one, on tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL models."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from policy.tiny_models import ARCHS, build_tiny_model  # noqa: E402
from train.logprobs import label_logprobs  # noqa: E402
from train.model_inputs import IGNORE_INDEX  # noqa: E402
from train.model_io import load_model  # noqa: E402
from train.packing import batch_tokens, pack_plan, prepare_batch  # noqa: E402

TOL = 1e-5
#: Per sample: (text tokens before the images, image grids (T, H, W in patches), reply tokens).
SAMPLES = [(5, [[1, 8, 12], [1, 4, 4]], 6), (9, [], 4), (3, [[1, 12, 8]], 7)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tiny_packing")
    return {arch: load_model(build_tiny_model(root / arch, arch, seed=1)) for arch in ARCHS}


def padded_batch(model: Any, seed: int = 0) -> dict[str, Any]:
    """A collated batch as :class:`train.samples.Collator` lays it out: right padding, labels on the reply."""
    cfg = model.config
    vc = cfg.vision_config
    gen = torch.Generator().manual_seed(seed)
    rows, labels, grids = [], [], []
    for text, images, reply in SAMPLES:
        ids = torch.randint(10, 300, (text,), generator=gen).tolist()
        for t, h, w in images:
            ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * (t * h * w // 4) + [cfg.vision_end_token_id]
            grids.append([t, h, w])
        ids += torch.randint(10, 300, (2,), generator=gen).tolist()
        target = torch.randint(10, 300, (reply,), generator=gen).tolist()
        labels.append([IGNORE_INDEX] * len(ids) + target)
        rows.append(ids + target)
    width = max(map(len, rows))
    n = len(rows)
    input_ids = torch.zeros((n, width), dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    label_t = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    for r, (ids, lab) in enumerate(zip(rows, labels, strict=True)):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        attention_mask[r, :len(ids)] = 1
        label_t[r, :len(lab)] = torch.tensor(lab)
    patches = sum(t * h * w for t, h, w in grids)
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": label_t,
            "loss_mask": label_t != IGNORE_INDEX,
            "pixel_values": torch.randn(patches, dim, generator=gen), "image_grid_thw": torch.tensor(grids),
            "mm_token_type_ids": (input_ids == cfg.image_token_id).to(torch.int32),
            "weights": torch.tensor([1.0, 0.5, 2.0]), "logprobs_temperature": torch.tensor([1.0, 0.7, 1.3])}


def loss_and_grads(model: Any, batch: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    logp, targets, rows, _ = label_logprobs(model, batch, torch.device("cpu"), batch["logprobs_temperature"])
    loss = -(batch["weights"][rows] * logp).sum() / batch["weights"][rows].sum()
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), logp.detach(), rows, grads


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_equals_padded(models: dict[str, Any], arch: str) -> None:
    model = models[arch].train()
    padded = padded_batch(model)
    packed = prepare_batch(padded, model, packing=True)
    assert packed["input_ids"].shape == (1, int(padded["attention_mask"].sum()))  # no padding
    assert "attention_mask" not in packed and packed["position_ids"].shape == (4, 1, packed["input_ids"].shape[1])
    assert batch_tokens(packed) == batch_tokens(padded)
    loss_a, logp_a, rows_a, grads_a = loss_and_grads(model, padded)
    loss_b, logp_b, rows_b, grads_b = loss_and_grads(model, packed)
    assert torch.equal(rows_a, rows_b)
    torch.testing.assert_close(logp_b, logp_a, atol=TOL, rtol=0)
    torch.testing.assert_close(loss_b, loss_a, atol=TOL, rtol=0)
    assert grads_a.keys() == grads_b.keys() and any(k.startswith("model.visual") or "visual" in k for k in grads_a)
    for k in grads_a:
        torch.testing.assert_close(grads_b[k], grads_a[k], atol=TOL, rtol=0, msg=k)


def test_packed_positions_are_per_sample(models: dict[str, Any]) -> None:
    """The positions of a packed sample are those it has alone; a sample without images is plain text."""
    model = models["qwen2_5_vl"]
    packed = prepare_batch(padded_batch(model), model, packing=True)
    lengths = packed["sample_lengths"].tolist()
    pos = packed["position_ids"][:, 0]
    start = lengths[0]
    second = pos[:, start:start + lengths[1]]
    assert torch.equal(second, torch.arange(lengths[1]).expand(4, -1))
    assert int(pos[0, start]) == 0 and int(pos[0, lengths[0] + lengths[1]]) == 0


def test_pack_plan() -> None:
    plan = pack_plan([5, 9, 3, 7, 2, 12], 12)
    assert sorted(i for mb in plan for i in mb) == list(range(6))
    lengths = [5, 9, 3, 7, 2, 12]
    assert all(sum(lengths[i] for i in mb) <= 12 for mb in plan)
    assert len(plan) == 4  # 12 | 9+3 | 7+5 | 2
    assert pack_plan([20, 1], 8) == [[0], [1]]  # too long: alone
    assert all(len(mb) <= 2 for mb in pack_plan([1] * 7, 100, max_samples=2))

