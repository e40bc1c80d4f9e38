"""The trainer's place in a run: one process on the CPU or one GPU, or a rank of a ``torchrun`` job with FSDP2.

:func:`setup_distributed` joins the process group when ``torchrun`` started the process (NCCL on GPUs, gloo on
CPUs); :func:`shard_model` applies FSDP2 (``fully_shard`` on every decoder layer and vision block, then on the
root).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class DistState:
    """This process's place in a (possibly one-process) run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: Any = None
    initialised_here: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes outputs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world > 1


def setup_distributed(device: str = "auto") -> DistState:
    """Join the process group when started by ``torchrun`` (``WORLD_SIZE`` > 1): NCCL on GPUs, gloo on CPUs."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if world > 1:
        here = False
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
            here = True
        if cuda:
            torch.cuda.set_device(local_rank)
            dev = torch.device("cuda", local_rank)
        else:
            dev = torch.device("cpu")
        return DistState(dist.get_rank(), dist.get_world_size(), local_rank, dev, here)
    dev = torch.device("cuda" if cuda else "cpu") if device == "auto" else torch.device(device)
    return DistState(0, 1, 0, dev, False)


def shard_model(model: Any, bf16: bool) -> None:
    """FSDP2: ``fully_shard`` every decoder layer and vision block (the classes HF lists in
    ``_no_split_modules``), then the root; bf16 parameters in compute, float32 gradient reduction."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw = {"mp_policy": mp} if mp is not None else {}
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard (_no_split_modules is empty)")
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
