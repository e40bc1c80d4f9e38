"""The vision tower's gated MLP with its intermediate width padded to a multiple of 8 (Qwen2.5-VL).

The released Qwen2.5-VL towers (3B, 7B, 32B, 72B) have a vision MLP 3,420 wide, which is not a multiple of 8. The
rows that cuBLAS reads for its matrix products are then not 16-byte aligned, and on a Hopper GPU it runs them with
older, slower kernels (``cutlass_80_tensorop_..._align2`` in a profile of ``bench.train_step``: the nine products of
each block's MLP, forward and backward, about a quarter of the GPU's time in a step with two screenshots).

:func:`set_vision_mlp` (``"aligned"``) makes each such MLP compute with its weights padded with zeros to the next
multiple of 8 (3,424): zero rows in ``gate_proj`` and ``up_proj``, zero columns in ``down_proj``. A padded unit gives
``act(0) * 0 = 0`` and adds nothing to the output, so the result is the MLP's own (up to the order of the sums
inside the kernels); the padding is made from the parameters in every forward (``F.pad``), so the gradients flow to
the parameters as they are. Parameters, state dicts and checkpoints keep their shapes; ``"default"`` restores
transformers' forward. Other towers (Qwen2-VL's 5,120, Qwen3-VL's 4,304) are aligned already and left as they are.
"""

from __future__ import annotations

import types
from typing import Any, Literal, get_args

from policy.vision_attention import vision_towers

#: The settings: ``aligned`` (padded to a multiple of :data:`ALIGN`) or ``default`` (transformers' forward).
VisionMlp = Literal["aligned", "default"]
VISION_MLP_MODES: tuple[VisionMlp, ...] = get_args(VisionMlp)

#: Elements of bf16/fp16 per 16 bytes: the alignment the GPU's fast matrix kernels need.
ALIGN = 8


def _aligned_forward(self: Any, hidden_state: Any) -> Any:
    """A gated MLP (``down(act(gate(x)) * up(x))``) with its intermediate dimension padded by ``self._webgym_pad``."""
    import torch.nn.functional as F

    pad = self._webgym_pad

    def rows(linear: Any) -> tuple[Any, Any]:
        bias = None if linear.bias is None else F.pad(linear.bias, (0, pad))
        return F.pad(linear.weight, (0, 0, 0, pad)), bias

    gate = F.linear(hidden_state, *rows(self.gate_proj))
    up = F.linear(hidden_state, *rows(self.up_proj))
    return F.linear(self.act_fn(gate) * up, F.pad(self.down_proj.weight, (0, pad)), self.down_proj.bias)


def _gated_mlps(model: Any) -> list[Any]:
    """The vision blocks' gated MLPs whose projections are plain linear layers (an adapter's wrapped layers are not
    touched: their own forward must run)."""
    import torch.nn as nn

    towers = vision_towers(model)
    mlps = [getattr(block, "mlp", None) for block in getattr(towers[0], "blocks", [])] if towers else []
    return [mlp for mlp in mlps if hasattr(mlp, "act_fn")
            and all(type(getattr(mlp, name, None)) is nn.Linear for name in ("gate_proj", "up_proj", "down_proj"))]


def set_vision_mlp(model: Any, mode: str) -> int:
    """Set how ``model``'s vision MLPs run (:data:`VISION_MLP_MODES`); returns how many now run padded."""
    if mode not in VISION_MLP_MODES:
        raise ValueError(f"vision_mlp must be one of {', '.join(VISION_MLP_MODES)}, not {mode!r}")
    padded = 0
    for mlp in _gated_mlps(model):
        mlp.__dict__.pop("forward", None)  # back to the class's forward
        mlp.__dict__.pop("_webgym_pad", None)
        width = mlp.gate_proj.out_features
        if mode == "aligned" and width % ALIGN:
            mlp._webgym_pad = -width % ALIGN
            mlp.forward = types.MethodType(_aligned_forward, mlp)
            padded += 1
    return padded
