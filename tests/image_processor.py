"""A test helper: Qwen3VLProcessor without its video processor (that one needs torchvision, whose PyPI wheel
would replace the CPU build of torch these tests run on)."""

from __future__ import annotations

from typing import Any

from transformers import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor with its image processor and tokenizer only."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None,
                 **kwargs: Any) -> None:
        for name, token in (("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
                            ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")):
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
