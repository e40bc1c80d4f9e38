"""Variable-length attention for the Qwen-VL vision towers: one attention call per block for all windows and images.

transformers' Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision attention (``*VisionAttention.forward``) splits the packed
patch sequence at ``cu_seqlens`` and calls the attention function once per chunk (one per image, or one per
window in Qwen2.5-VL's windowed blocks: thousands of small calls per training step on a GPU), unless the
configured implementation's name contains ``"flash"`` (``transformers.utils.generic.is_flash_attention_requested``).
Then it makes one call with the whole sequence and ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (the chunk boundaries)
and ``max_length_q`` / ``max_length_k`` (the longest chunk).

This module registers :func:`policy.varlen_attention.varlen_attention_forward` under such a name
(:data:`VARLEN_IMPLEMENTATION`) with ``transformers.AttentionInterface`` and sets it on the vision tower's config
only (:func:`set_vision_attention`); the language model keeps its own implementation (SDPA or eager). This module
imports nothing heavy: the attention itself lives in :mod:`policy.varlen_attention`, imported when registered.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, get_args

log = logging.getLogger(__name__)

#: The settings: ``varlen`` (one call per block) or ``default`` (transformers' own per-chunk loop).
VisionAttention = Literal["varlen", "default"]
VISION_ATTENTION_MODES: tuple[VisionAttention, ...] = get_args(VisionAttention)

#: The name the varlen attention is registered under. It must contain "flash": that is what makes transformers'
#: Qwen-VL vision attention pass ``cu_seq_lens_q`` and make a single call.
VARLEN_IMPLEMENTATION = "flash_varlen_sdpa"

#: Model types whose vision attention hands ``cu_seqlens`` to a "flash" implementation (checked against
#: transformers 5.x's modeling code); others keep their default.
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})


def register() -> str:
    """Register the varlen attention with transformers (idempotent); return its name."""
    from transformers import AttentionInterface

    from policy.varlen_attention import varlen_attention_forward

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
