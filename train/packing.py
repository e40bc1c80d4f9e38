"""Sequence packing: the samples of a micro-batch as one row of tokens, without padding.

A collated batch (:class:`train.samples.Collator`: one right-padded row per sample) becomes one row holding every
sample's tokens back to back (:func:`pack_batch`). Each sample keeps its own positions: the M-RoPE position ids of
each sample are computed on its own by the model's ``get_rope_index`` (:func:`packed_position_ids`), and a row of
plain text positions restarting at 0 goes first (``position_ids`` of shape ``(4, 1, total)``). From that row
transformers' Qwen-VL language models find where each sample starts (``masking_utils.find_packed_sequence_indices``,
used when the forward gets no ``attention_mask``), so attention stays inside each sample. Labels never cross a
boundary: a sample's first token is a prompt token, never a label. The vision tower needs nothing: its input
(``pixel_values``, ``image_grid_thw``) is the same in both layouts.

The per-sample keys (weights, advantages, temperatures...) are kept as they are; ``sample_index`` says which
sample each token belongs to, so :func:`train.logprobs.label_logprobs` returns the sample of each label as its
``rows``, exactly as for a padded batch. :func:`pack_plan` groups samples into micro-batches by a token budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Keys of a collated batch with one entry per token, laid out (B, T); packed into (1, total).
_TOKEN_KEYS = ("input_ids", "labels", "loss_mask", "behaviour_logprobs", "mm_token_type_ids")


def pack_plan(lengths: Sequence[int], max_tokens: int, *, max_samples: int | None = None) -> list[list[int]]:
    """Micro-batches of sample indices whose lengths add up to at most ``max_tokens`` (first fit, longest first;
    a longer sample gets a micro-batch of its own), each in ascending index order; at most ``max_samples`` per
    micro-batch when given."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    bins: list[tuple[int, list[int]]] = []  # (tokens, indices)
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        for k, (used, members) in enumerate(bins):
            if used + lengths[i] <= max_tokens and (max_samples is None or len(members) < max_samples):
                bins[k] = (used + lengths[i], [*members, i])
                break
        else:
            bins.append((lengths[i], [i]))
    return [sorted(members) for _, members in bins]


def pack_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """The collated ``batch`` as one packed row (see the module docstring); ``attention_mask`` is left out and
    ``sample_index`` (1, total), ``sample_lengths`` (B,) and ``tokens`` (the token count) are added.
    Call :func:`packed_position_ids` with the model for the ``position_ids``."""
    import torch

    lengths = batch["attention_mask"].sum(dim=1)
    keep = batch["attention_mask"].bool()
    out = {k: v for k, v in batch.items() if k not in (*_TOKEN_KEYS, "attention_mask")}
    for key in _TOKEN_KEYS:
        if key in batch:
            out[key] = batch[key][keep].unsqueeze(0)  # row-major: sample after sample
    out["sample_index"] = torch.repeat_interleave(torch.arange(len(lengths)), lengths).unsqueeze(0)
    out["sample_lengths"] = lengths
    out["tokens"] = int(lengths.sum())
    return out


def _images_per_sample(batch: dict[str, Any], image_token_id: int, merge: int) -> list[int]:
    """How many of the batch's images belong to each sample, from the sample's image tokens and the grids."""
    counts = []
    grids = batch.get("image_grid_thw")
    tokens = [] if grids is None else (grids.prod(dim=-1) // (merge * merge)).tolist()
    start = 0
    ids, index = batch["input_ids"][0], batch["sample_index"][0]
    for s in range(len(batch["sample_lengths"])):
        n_tokens = int(((index == s) & (ids == image_token_id)).sum())
        n = 0
        while n_tokens > 0 and start + n < len(tokens):
            n_tokens -= tokens[start + n]
            n += 1
        if n_tokens != 0:
            raise ValueError(f"sample {s}: its image tokens do not match the batch's image grids")
        counts.append(n)
        start += n
    return counts


def packed_position_ids(model: Any, batch: dict[str, Any]) -> Any:
    """The ``(4, 1, total)`` position ids of a packed ``batch``: text positions restarting at 0 for each sample,
    then each sample's own M-RoPE (T, H, W) positions from the model's ``get_rope_index``."""
    import torch

    inner = model.model if hasattr(model.model, "get_rope_index") else model
    config = model.config
    merge = config.vision_config.spatial_merge_size
    ids = batch["input_ids"][0]
    types = batch.get("mm_token_type_ids")
    types = (ids == config.image_token_id).to(torch.int32) if types is None else types[0]
    grids = batch.get("image_grid_thw")
    per_sample = _images_per_sample(batch, config.image_token_id, merge)
    parts, start, image = [], 0, 0
    for s, length in enumerate(batch["sample_lengths"].tolist()):
        seg = slice(start, start + length)
        n = per_sample[s]
        rope, _ = inner.get_rope_index(ids[None, seg], mm_token_type_ids=types[None, seg],
                                       # n > 0 only with grids (_images_per_sample)
                                       image_grid_thw=grids[image:image + n] if n and grids is not None else None)
        text = torch.arange(length, dtype=rope.dtype, device=rope.device).view(1, 1, -1)
        parts.append(torch.cat([text, rope], dim=0))
        start, image = start + length, image + n
    return torch.cat(parts, dim=2)


def prepare_batch(collated: dict[str, Any], model: Any, packing: bool) -> dict[str, Any]:
    """The batch the forward takes: ``collated`` as it is, or packed with its position ids."""
    if not packing:
        return collated
    packed = pack_batch(collated)
    packed["position_ids"] = packed_position_ids(model, packed)
    return packed


def batch_tokens(batch: dict[str, Any]) -> int:
    """The real (not padding) tokens of a batch, packed or padded."""
    if "tokens" in batch:
        return int(batch["tokens"])
    return int(batch["attention_mask"].sum())
