"""Which samples go into which micro-batch and optimizer step: length bucketing, or packing by a token budget."""

from __future__ import annotations

import random
from collections.abc import Sequence

from train.config import TrainConfig
from train.packing import pack_plan
from train.samples import bucket_batches


def micro_batches(lengths: Sequence[int], cfg: TrainConfig, *, shuffle: bool, seed: int) -> list[list[int]]:
    """The micro-batches (sample indices) of one pass over the samples.

    Padded batches (``packing = false``): :func:`train.samples.bucket_batches` (``batch_size`` samples of similar
    lengths, at most ``max_tokens`` padded tokens). Packed (``packing = true`` with ``max_tokens``): as many samples
    as fit ``max_tokens`` tokens, at most ``batch_size``, with no padding (:func:`train.packing.pack_plan`); without
    ``max_tokens`` the bucketed batches are packed as they are.
    """
    if not (cfg.packing and cfg.max_tokens):
        return bucket_batches(lengths, cfg.batch_size, window=cfg.bucket_window, max_tokens=cfg.max_tokens,
                              shuffle=shuffle, seed=seed)
    micro = pack_plan(lengths, cfg.max_tokens, max_samples=cfg.batch_size)
    if shuffle:
        random.Random(seed).shuffle(micro)
    return micro


def plan_steps(lengths: Sequence[int], cfg: TrainConfig, world: int, epoch: int) -> list[list[list[int]]]:
    """One epoch's optimizer steps: each a list of ``world * grad_accum`` micro-batches (sample indices), rank
    ``r`` taking micro-batches ``r, r + world, ...``. The last step is filled from the epoch's first
    micro-batches when the ranks would otherwise disagree on the number of micro-batches (every rank must run
    the same collectives); one process keeps a short last step as it is."""
    micro = micro_batches(lengths, cfg, shuffle=cfg.shuffle, seed=cfg.seed + epoch)
    per_step = world * cfg.grad_accum
    steps = [micro[i:i + per_step] for i in range(0, len(micro), per_step)]
    if world > 1 and steps and len(steps[-1]) < per_step:
        need = per_step - len(steps[-1])
        filler = [micro[i % len(micro)] for i in range(need)]
        steps[-1] = steps[-1] + filler
    return steps
