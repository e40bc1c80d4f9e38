"""The learning-rate schedule: linear warm-up, then constant or a cosine down to a floor."""

from __future__ import annotations

import math
from typing import Any

from train.config import TrainConfig


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float = 0.0) -> float:
    """The LR multiplier after ``step`` optimizer steps: linear warm-up from 1/(warmup+1) to 1 over
    ``warmup_steps``, then constant or a cosine from 1 down to ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: Any, cfg: TrainConfig, total_steps: int) -> Any:
    """A ``LambdaLR`` with :func:`lr_factor`."""
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio))
