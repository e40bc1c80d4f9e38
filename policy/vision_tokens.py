"""The vision placeholder token ids of a Qwen-VL config (image, video, vision start and end): a module of its own
so that code which only runs the model (the trainer's log-probabilities, ``bench.train_step``) needs no prompt
building or image codec."""

from __future__ import annotations

from typing import Any

VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def vision_token_ids(config: Any) -> list[int]:
    """The vision placeholder ids of a Qwen-VL config: never part of a reply (the hf backend suppresses them
    when it samples, and the trainer leaves them out of its log-probabilities the same way)."""
    return sorted({t for t in (getattr(config, k, None) for k in VISION_TOKEN_KEYS) if isinstance(t, int) and t >= 0})
