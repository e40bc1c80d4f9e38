"""The model on disk: loading a Qwen-VL model directory for training and writing checkpoints that load as it did.

A checkpoint is a Hugging Face model directory (weights, config, and the source's tokenizer, chat template and
``preprocessor_config.json``) that :class:`policy.hf_backend.HFModel` and vLLM load as they are.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

from policy.vision_attention import set_vision_attention, vision_towers

#: Files of a model directory that the checkpoint takes from the source (save_pretrained writes the rest).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5")
_WRITTEN_BY_SAVE = ("config.json", "generation_config.json", "model.safetensors.index.json",
                    "pytorch_model.bin.index.json")


def model_class(config: Any) -> Any:
    """The transformers class for a Qwen-VL config (as :mod:`policy.hf_backend` finds it)."""
    import transformers

    with contextlib.suppress(Exception):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText._model_mapping[type(config)]
    archs = getattr(config, "architectures", None) or []
    cls = next((getattr(transformers, a) for a in archs if hasattr(transformers, a)), None)
    if cls is None:
        raise ValueError(f"no transformers class for model type {config.model_type!r}")
    return cls


def load_model(model_dir: str | Path, dtype: Any = None, attn_implementation: str | None = None,
               vision_attention: str = "varlen") -> Any:
    """The model of ``model_dir`` in ``dtype`` (default float32: master weights for mixed precision).

    ``attn_implementation`` goes to ``from_pretrained`` (the language model's attention); ``vision_attention``
    sets the vision tower's (:func:`policy.vision_attention.set_vision_attention`: ``"varlen"``, one attention
    call per block for all images and windows, or ``"default"``, transformers' loop over them)."""
    import torch
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    kwargs: dict[str, Any] = {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    kwargs["dtype" if major_minor >= (4, 56) else "torch_dtype"] = dtype or torch.float32
    model = model_class(config).from_pretrained(model_dir, config=config, **kwargs)
    set_vision_attention(model, vision_attention)
    return model


#: ``gradient_checkpointing`` settings besides true and false: the vision tower's blocks only.
CHECKPOINT_VISION = "vision"


def set_checkpointing(model: Any, on: bool | str) -> None:
    """Activation (gradient) checkpointing, non-reentrant (works with FSDP2 and with inputs that need no grad):
    ``True`` for every decoder layer and vision block, ``False`` for none, ``"vision"`` for the vision tower's
    blocks only (a screenshot's thousands of patches through every block hold much of a step's activations, while
    the language model then runs without a recompute). transformers >= 5.2x names it ``activation_checkpointing_*``."""
    if on not in (True, False, CHECKPOINT_VISION):
        raise ValueError(f"checkpointing must be true, false or {CHECKPOINT_VISION!r}, not {on!r}")
    if on:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if on == CHECKPOINT_VISION:
            towers = vision_towers(model)
            if not towers:
                raise ValueError(f"{type(model).__name__} has no vision tower to checkpoint on its own")
            inside = {id(m) for m in towers[0].modules()}
            for module in model.modules():
                if id(module) not in inside and hasattr(module, "gradient_checkpointing"):
                    module.gradient_checkpointing = False
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def copy_processor_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer, chat template and processor configs of ``src`` into the checkpoint ``dst``."""
    copied = []
    for path in sorted(Path(src).iterdir()):
        if not path.is_file() or path.name in _WRITTEN_BY_SAVE or path.name.endswith(_WEIGHT_SUFFIXES):
            continue
        if path.name.endswith(".index.json"):
            continue
        if path.suffix not in (".json", ".jinja", ".txt", ".model", ".tiktoken", ".py"):
            continue
        shutil.copy2(path, Path(dst) / path.name)
        copied.append(path.name)
    return copied


def write_checkpoint(model: Any, state: dict[str, Any], path: Path, *, class_name: str, dtype: Any,
                     source_dir: str | Path) -> None:
    """Write the full ``state`` (one process's, gathered) of ``model`` as a Hugging Face directory at ``path``:
    floating-point tensors in ``dtype``, ``architectures`` naming ``class_name`` (not a wrapper's class), and the
    processor files of ``source_dir``."""
    state = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
             for k, v in state.items()}
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, state_dict=state, safe_serialization=True)
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = [class_name]  # not FSDP's wrapper class
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = str(dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    copy_processor_files(source_dir, path)
