"""Stand-ins for the veRL adapter's tests (veRL's vLLM / SGLang servers need a GPU), and the tiny model's processor.

:class:`VerlServerManagerStandIn` answers veRL's call, ``await server_manager.generate(request_id, *, prompt_ids,
sampling_params, image_data) -> TokenOutput`` (``token_ids``, ``log_probs``). Like a vLLM server it checks that the
prompt's image placeholders match the images it is given (one ``<|vision_start|>`` per image and as many
``<|image_pad|>`` tokens as the image processor makes merged patches), then answers with a scripted reply's tokens
and log-probabilities. :func:`tiny_processor` is the processor the loops render prompts with. Used by
``tests/test_adapters_verl.py`` (the project's environment, no veRL) and ``tests/frameworks/test_verl.py``
(veRL's environment).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from policy.tiny_models import build_tiny_model

#: The replies of a three-step episode: an unusable one (the engine records a wait and its parse error), a scroll,
#: and an answer that ends the episode.
SCRIPT = [
    "Action: click it\n<tool_call>\n{broken",
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "scroll", "direction": "down"}}\n</tool_call>',
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "answer", "text": "done"}}\n</tool_call>',
]


class VerlServerManagerStandIn:
    """A stand-in for veRL's server manager (module docstring): checks a prompt like vLLM, answers from a script.

    A plain class, not a dataclass: ``hydra.utils.instantiate`` would turn a dataclass argument into a config."""

    def __init__(self, processor: Any, script: list[str]) -> None:
        self.processor = processor
        self.script = script
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: list[Any] | None = None, **kwargs: Any) -> SimpleNamespace:
        tok = self.processor.tokenizer
        images = image_data or []
        starts = prompt_ids.count(tok.convert_tokens_to_ids("<|vision_start|>"))
        pads = prompt_ids.count(tok.convert_tokens_to_ids("<|image_pad|>"))
        grids = self.processor.image_processor(images=images)["image_grid_thw"] if images else []
        merge = self.processor.image_processor.merge_size ** 2
        assert starts == len(images) and pads == sum(int(np.prod(g)) // merge for g in grids), (starts, pads)
        reply = self.script[len(self.calls) % len(self.script)]
        token_ids = tok.encode(reply, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        self.calls.append({"request_id": request_id, "prompt_ids": prompt_ids, "images": images,
                           "sampling_params": sampling_params})
        return SimpleNamespace(token_ids=token_ids, log_probs=[-0.5] * len(token_ids), num_preempted=0)


def tiny_processor(directory: Path) -> Any:
    """The processor of a tiny random Qwen3-VL built offline in ``directory``: ``Qwen3VLProcessor`` without its video
    processor (:mod:`tests.image_processor`; the video one needs torchvision, which has no CPU build here), with
    the image processor's PIL backend named directly (veRL's transformers, 5.10, asks for torchvision otherwise)."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tests.image_processor import ImageOnlyQwen3VLProcessor

    model_dir = build_tiny_model(directory, "qwen3_vl", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return ImageOnlyQwen3VLProcessor(Qwen2VLImageProcessorPil.from_pretrained(model_dir), tokenizer,
                                     chat_template=tokenizer.chat_template)
