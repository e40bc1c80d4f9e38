"""The attention of :mod:`policy.vision_attention`'s ``varlen`` mode: every chunk (image or window) of a packed
patch sequence attended within itself in one ``scaled_dot_product_attention`` call.

The chunks are laid out as rows of one padded batch (a layout built once per ``cu_seqlens`` tensor, that is once per
forward, and reused by every block), with a key-padding mask when the chunks differ in length and none when they
are all alike (screenshots of one size, Qwen2-VL / Qwen3-VL). It is exact: padded keys get zero weight, padded
query rows are dropped, and the gradients of the padding are zero.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


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


# Run eagerly when a torch.compile'd block calls it (one graph break per block): the layout's shapes depend on the
# chunk lengths' values, and the cache takes a lock, which torch.compile does not trace.
@torch.compiler.disable
def _layout(cu_seqlens: Any, total: int, max_length: int | None) -> _Layout:
    """The padded layout of ``cu_seqlens`` (cached by the tensor's identity: every block of one forward gets the
    same tensor, so the layout is built once per forward)."""
    with _cache_lock:
        for ref, layout in _cache:
            if ref() is cu_seqlens:
                return layout
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
