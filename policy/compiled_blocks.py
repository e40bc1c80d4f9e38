"""``torch.compile`` of a Qwen-VL model's repeated blocks: the vision tower's blocks and the language model's layers.

A training step with screenshots launches over ten thousand kernels, most of them small elementwise ones (norms in
float32, rotary embeddings, activations, casts), and with one sequence per step the host's launches, not the GPU,
bound it (``bench.train_step --profile``). Compiling each block fuses those chains into a few kernels per block.

Each block is compiled in place (``nn.Module.compile``) rather than the whole model: the blocks of one kind share
their code, so one compiled graph serves all of them (parameters are the graph's inputs), compile time stays that of
one block of each kind, and what runs between the blocks (the tower's window layout, the M-RoPE positions, the
label log-probabilities) stays eager. The varlen vision attention builds its padded layout outside the graphs
(:mod:`policy.varlen_attention`): its shapes depend on the window lengths' values. That graph break cannot sit
inside activation checkpointing's recompute region (PyTorch would run the whole block eagerly), so a checkpointed
vision block is compiled one level down: its attention, MLP and norms, each a graph of its own. A decoder layer
has no graph break and is compiled whole, checkpointed or not.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from policy.vision_attention import vision_towers

#: The settings: ``off``, ``vision`` (the vision tower's blocks), ``all`` (those and the language model's layers).
CompileMode = Literal["off", "vision", "all"]
COMPILE_MODES: tuple[CompileMode, ...] = get_args(CompileMode)

#: The graphs TorchDynamo may keep per code object once blocks are compiled (its default is 8).
RECOMPILE_LIMIT = 64


def repeated_blocks(model: Any) -> tuple[list[Any], list[Any]]:
    """The vision tower's blocks and the language model's decoder layers of ``model`` (either list may be empty)."""
    import torch.nn as nn

    towers = vision_towers(model)
    vision = list(getattr(towers[0], "blocks", [])) if towers else []
    inside = {id(m) for m in towers[0].modules()} if towers else set()
    language = next((list(m.layers) for m in model.modules()
                     if id(m) not in inside and isinstance(getattr(m, "layers", None), nn.ModuleList)), [])
    return vision, language


def check_backend(backend: str) -> None:
    """Raise ValueError unless ``torch.compile`` knows ``backend`` (its debugging backends, such as eager and
    aot_eager, count too): before a model loads, rather than at its first compiled block."""
    import torch._dynamo

    if backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise ValueError(f"compile backend {backend!r} is not a torch.compile backend (such as inductor, aot_eager "
                         "or eager; torch._dynamo.list_backends() names them)")


def set_compiled_blocks(model: Any, mode: str, backend: str = "inductor", compile_mode: str | None = None) -> int:
    """Compile ``model``'s blocks for ``mode`` (:data:`COMPILE_MODES`) with ``backend`` and ``torch.compile``'s own
    ``compile_mode`` (None: its default; ``"reduce-overhead"``: each compiled graph replayed as a CUDA graph), and
    return how many are compiled now. Safe to call again to switch: blocks left out of ``mode`` run eagerly again.
    The graphs are built at each block's first call (the first step takes the compile time). Call it after
    :func:`train.model_io.set_checkpointing`: a checkpointed vision block is compiled part by part. Raises
    TorchDynamo's process-wide ``recompile_limit`` to :data:`RECOMPILE_LIMIT` when anything is compiled."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, not {mode!r}")
    vision, language = repeated_blocks(model)
    count = {"off": 0, "vision": len(vision), "all": len(vision) + len(language)}[mode]
    if mode != "off" and not count:
        raise ValueError(f"{type(model).__name__} has no blocks for compile mode {mode!r}")
    if count:
        import torch._dynamo

        # Process-wide: every checkpointable layer class of transformers runs one wrapper's code
        # (GradientCheckpointingLayer's forward_with_checkpointing), so windowed blocks, full-attention blocks and
        # decoder layers, each at a few shapes, share one code object's cache of compiled graphs (default limit 8).
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for block in vision:
        # A checkpointed vision block is compiled one level down (its attention, MLP and norms): checkpoint runs its
        # body as one region that cannot hold the attention layout's graph break, and would run it eagerly.
        down = bool(getattr(block, "gradient_checkpointing", False))
        _set_compiled(block, mode != "off" and not down, backend, compile_mode)
        for child in block.children():
            _set_compiled(child, mode != "off" and down, backend, compile_mode)
    for layer in language:
        _set_compiled(layer, mode == "all", backend, compile_mode)
    return count


def _set_compiled(module: Any, on: bool, backend: str, compile_mode: str | None) -> None:
    if on:
        module.compile(backend=backend, mode=compile_mode)
    else:
        module._compiled_call_impl = None  # what nn.Module.compile sets; None: its eager forward again
