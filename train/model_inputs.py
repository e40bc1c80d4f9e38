"""What a model's forward takes, apart from the samples that feed it: the label value the loss ignores, and whether
the forward wants ``mm_token_type_ids``. Light on purpose: code that only runs the model (``bench.train_step``,
:mod:`train.logprobs`) imports it without the engine's records or the image codec."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

#: Labels of positions the loss leaves out (PyTorch's cross-entropy default).
IGNORE_INDEX = -100


def model_wants_mm_token_types(model_or_dir: Any) -> bool:
    """Whether the model's forward takes ``mm_token_type_ids`` (transformers >= 5 computes M-RoPE positions from
    them), for a loaded model or a model directory (its class is found from ``config.json``, nothing loaded)."""
    if isinstance(model_or_dir, (str, Path)):
        from transformers import AutoConfig, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(model_or_dir)
        try:
            cls = AutoModelForImageTextToText._model_mapping[type(config)]
        except KeyError:
            return False
        return "mm_token_type_ids" in inspect.signature(cls.forward).parameters
    return "mm_token_type_ids" in inspect.signature(model_or_dir.forward).parameters
