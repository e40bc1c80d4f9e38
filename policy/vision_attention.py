"""Variable-length attention for the Qwen-VL vision towers: one attention call per block for all windows and images.

transformers' Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision attention (``*VisionAttention.forward``) splits the packed
patch sequence at ``cu_seqlens`` and calls the attention function once per chunk (one per image, or one per
window in Qwen2.5-VL's windowed blocks: thousands of small calls per training step on a GPU), unless the
configured implementation's name contains ``"flash"`` (``transformers.utils.generic.is_flash_attention_requested``).
Then it makes one call with the whole sequence and ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (the chunk boundaries)
and ``max_length_q`` / ``max_length_k`` (the longest chunk).

This module registers :func:`varlen_attention_forward` under such a name (:data:`VARLEN_IMPLEMENTATION`) with
``transformers.AttentionInterface`` and sets it on the vision tower's config only (:func:`set_vision_attention`);
the language model keeps its own implementation (SDPA or eager). The function lays the chunks out as rows of one
padded batch (a layout built once per ``cu_seqlens`` tensor, that is once per forward, and reused by every block)
and runs one ``scaled_dot_product_attention`` call, with a key-padding mask when the chunks differ in length and
none when they are all alike (screenshots of one size, Qwen2-VL / Qwen3-VL). It is exact: padded keys get zero
weight, padded query rows are dropped, and the gradients of the padding are zero.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: The settings: ``varlen`` (one call per block) or ``default`` (transformers' own per-chunk loop).
VISION_ATTENTION_MODES: tuple[str, ...] = ("varlen", "default")

#: The name :func:`varlen_attention_forward` is registered under. It must contain "flash": that is what makes
#: transformers' Qwen-VL vision attention pass ``cu_seq_lens_q`` and make a single call.
VARLEN_IMPLEMENTATION = "flash_varlen_sdpa"

#: Model types whose vision attention hands ``cu_seqlens`` to a "flash" implementation (checked against
#: transformers 5.x's modeling code); others keep their default.
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where each token of the packed sequence sits in the padded ``(count, length)`` batch."""

    count: int  # chunks (images or windows)
    length: int  # the padded row length: the longest chunk
    index: Any  # (total,) long: row * length + offset of each token; None when no padding is needed
    mask: Any  # (count, 1, 1, length) bool, True on real keys; None when no padding is needed


_cache_lock = threading.Lock()
_cache: list[tuple[weakref.ref[Any], _Layout]] = []
_CACHE_SIZE = 8  # a forward uses at most two cu_seqlens tensors (windows, whole images); a few threads may overlap


def _layout(cu_seqlens: Any, total: int, max_length: int | None) -> _Layout:
    """The padded layout of ``cu_seqlens`` (cached by the tensor's identity: every block of one forward gets the
    same tensor, so the layout is built once per forward)."""
    with _cache_lock:
        for ref, layout in _cache:
            if ref() is cu_seqlens:
                return layout
    import torch

    cu = cu_seqlens.to(torch.long)
    lengths = cu[1:] - cu[:-1]
    count = int(lengths.numel())
    length = int(max_length) if max_length is not None else int(lengths.max())
    if count * length == total:  # every chunk as long as the longest: a plain reshape, no mask
        layout = _Layout(count, length, None, None)
    else:
        device = cu.device
        # Built on the device without a host sync: the total is known from the query's shape.
        row = torch.repeat_interleave(torch.arange(count, device=device), lengths, output_size=total)
        offset = torch.arange(total, device=device) - cu[:-1][row]
        index = row * length + offset
        mask = torch.arange(length, device=device)[None, :] < lengths[:, None]
        mask[:, 0] = True  # an empty chunk's (discarded) row stays finite
        layout = _Layout(count, length, index, mask[:, None, None, :])
    with _cache_lock:
        _cache[:] = [(r, lay) for r, lay in _cache if r() is not None][-(_CACHE_SIZE - 1):]
        _cache.append((weakref.ref(cu_seqlens), layout))
    return layout


def varlen_attention_forward(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
    dropout: float = 0.0, is_causal: bool | None = None, cu_seq_lens_q: Any = None, cu_seq_lens_k: Any = None,
    max_length_q: int | None = None, max_length_k: int | None = None, **kwargs: Any,
) -> tuple[Any, None]:
    """Attention within each chunk of a packed sequence, in one SDPA call (transformers' attention-interface
    signature). ``query``/``key``/``value``: ``(1, heads, total, head_dim)``; ``cu_seq_lens_q``: the chunk
    boundaries (``(count + 1,)``); returns ``((1, total, heads, head_dim), None)`` as the flash implementations do.
    Without ``cu_seq_lens_q`` (a caller that is not a Qwen-VL vision tower) it is plain SDPA."""
    import torch
    import torch.nn.functional as F

    if cu_seq_lens_q is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q and not torch.equal(cu_seq_lens_k,
                                                                                            cu_seq_lens_q):
        raise ValueError("varlen vision attention: queries and keys must share their chunk boundaries")
    if query.shape[0] != 1:
        raise ValueError(f"varlen vision attention: expected one packed sequence, got a batch of {query.shape[0]}")
    heads, total = query.shape[1], query.shape[2]
    lay = _layout(cu_seq_lens_q, total, max_length_q)
    sdpa: dict[str, Any] = {"dropout_p": dropout, "scale": scaling}
    if lay.count == 1:
        out = F.scaled_dot_product_attention(query, key, value, **sdpa)
        return out.transpose(1, 2), None
    if lay.index is None:
        # (1, H, count * L, D) -> (count, H, L, D): a view, no copy.
        def rows(x: Any) -> Any:
            return x[0].unflatten(1, (lay.count, lay.length)).transpose(0, 1)

        out = F.scaled_dot_product_attention(rows(query), rows(key), rows(value), **sdpa)
        return out.transpose(1, 2).reshape(1, total, heads, out.shape[-1]), None

    def padded(x: Any) -> Any:
        flat = x[0].transpose(0, 1)  # (total, H, D)
        buf = flat.new_zeros((lay.count * lay.length, heads, flat.shape[-1]))
        return buf.index_copy(0, lay.index, flat).unflatten(0, (lay.count, lay.length)).transpose(1, 2)

    out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value), attn_mask=lay.mask, **sdpa)
    out = out.transpose(1, 2).flatten(0, 1).index_select(0, lay.index)  # (total, H, D): padding dropped
    return out.unsqueeze(0), None


def register() -> str:
    """Register :func:`varlen_attention_forward` with transformers (idempotent); return its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_IMPLEMENTATION, varlen_attention_forward)
    return VARLEN_IMPLEMENTATION


def vision_towers(model: Any) -> list[Any]:
    """The vision tower modules of a Qwen-VL model (those holding its ``vision_config``), outermost first."""
    vision_config = getattr(model.config, "vision_config", None)
    if vision_config is None:
        return []
    vision_type = getattr(vision_config, "model_type", None)
    return [m for m in model.modules() if m is not model and hasattr(m, "config") and hasattr(m, "blocks")
            and (m.config is vision_config or getattr(m.config, "model_type", None) == vision_type)]


def set_vision_attention(model: Any, mode: str) -> str:
    """Set the attention implementation of ``model``'s vision tower for ``mode`` (:data:`VISION_ATTENTION_MODES`)
    and return the implementation now used there.

    ``varlen``: :data:`VARLEN_IMPLEMENTATION` on Qwen2-VL, Qwen2.5-VL and Qwen3-VL (other models keep their
    default, with a log line; a model loaded with a flash-attention kernel keeps it: it already makes one call per
    block); ``default``: the language model's implementation, as transformers sets it. Only
    the vision configs change; the language model's attention is left as it is. Safe to call again to switch.
    """
    if mode not in VISION_ATTENTION_MODES:
        raise ValueError(f"vision_attention must be one of {', '.join(VISION_ATTENTION_MODES)}, not {mode!r}")
    config = model.config
    text_config = getattr(config, "text_config", None)
    default = getattr(text_config, "_attn_implementation", None) or config._attn_implementation or "sdpa"
    if default == VARLEN_IMPLEMENTATION:
        default = "sdpa"
    towers = vision_towers(model)
    wanted = default
    if mode == "varlen":
        if "flash" in default:
            pass  # a flash-attention kernel already makes one varlen call per block
        elif config.model_type in SUPPORTED_MODEL_TYPES and towers:
            wanted = register()
        else:
            log.info("vision_attention=varlen: not available for model type %r; keeping %s", config.model_type,
                     default)
    # Set on the config objects themselves (the tower's may be a copy of config.vision_config): transformers'
    # set_attn_implementation would also validate the name as a flash kernel to fetch, which this one is not.
    configs = {id(c): c for c in [getattr(config, "vision_config", None), *(t.config for t in towers)] if c}
    for c in configs.values():
        c._attn_implementation = wanted
    return wanted
