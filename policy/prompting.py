"""The model's prompt as token ids: chat template, then one image placeholder expanded per image.

One function for everything that needs the exact sequence a Qwen-VL model sees: the ``hf`` backend when it
generates, and training (:mod:`train.samples`) when it rebuilds a recorded step. Sharing it is what makes a
rebuilt prompt equal, token for token, to the one the policy was given (checked by :func:`prompt_sha256`,
which the backend records with every reply).

The recipe: ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``, that
text tokenized without extra special tokens, then every ``<|image_pad|>`` id (one per image part) replaced
by as many pads as the image has LLM tokens after preprocessing (:func:`policy.vision.preprocess_jpeg`).
Expansion happens on ids, not on text, so a template that writes the pad differently cannot miscount.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine import _imgcodec as codec
from engine.agent.model_api import image_refs
from policy.vision import ProcessedImage, VisionConfig, preprocess_jpeg, target_size

#: Where the JPEG bytes of an image REF come from: a mapping (a request's images) or a loader (a run dir).
ImageSource = Mapping[str, bytes] | Callable[[str], bytes]


class PromptError(ValueError):
    """The prompt cannot be built: an image missing or undecodable, placeholders that do not match."""


def load_tokenizer(model_dir: str | Path) -> Any:
    """The model directory's tokenizer, with its chat template (older checkpoints keep the template in
    ``chat_template.json``, beside the processor, instead of in the tokenizer config)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if getattr(tokenizer, "chat_template", None) is None:
        template = Path(model_dir) / "chat_template.json"
        if template.exists():
            tokenizer.chat_template = json.loads(template.read_text())["chat_template"]
    return tokenizer


def image_token_id_of(tokenizer: Any, config: Any = None) -> int:
    """The ``<|image_pad|>`` id: the model config's ``image_token_id`` when it has one, else the tokenizer's."""
    tid = getattr(config, "image_token_id", None) if config is not None else None
    if tid is None:
        tid = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return int(tid)


def chat_token_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
                   lock: Any = None) -> list[int]:
    """The chat template's token ids for ``messages``, placeholders not yet expanded.

    ``lock``: a context manager held around the tokenizer calls (the Rust tokenizer is not safe to share
    between threads that change its padding state; the backend serialises calls with one).
    """
    with lock if lock is not None else contextlib.nullcontext():
        text = tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
        ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def expand_image_pads(ids: Sequence[int], image_token_id: int, num_tokens: Sequence[int]) -> list[int]:
    """``ids`` with the i-th ``image_token_id`` repeated ``num_tokens[i]`` times; PromptError on a count mismatch."""
    slots = [i for i, tid in enumerate(ids) if tid == image_token_id]
    if len(slots) != len(num_tokens):
        raise PromptError(f"the prompt has {len(slots)} image placeholders for {len(num_tokens)} images")
    expanded: list[int] = []
    start = 0
    for slot, n in zip(slots, num_tokens, strict=True):
        expanded.extend(ids[start:slot])
        expanded.extend([image_token_id] * int(n))
        start = slot + 1
    expanded.extend(ids[start:])
    return expanded


def load_images(messages: Sequence[dict[str, Any]], images: ImageSource,
                vision_cfg: VisionConfig | None) -> list[ProcessedImage]:
    """Every image part of ``messages``, in order, preprocessed for the model (decode, resize, patchify).
    ``vision_cfg`` None: a text-only model, whose prompts may hold no image (PromptError otherwise)."""
    get = images if callable(images) else None
    if vision_cfg is None:
        if image_refs(list(messages)):
            raise PromptError("a text-only model reads no images: observe the accessibility tree alone "
                              "(--observe axtree)")
        return []
    out: list[ProcessedImage] = []
    for ref in image_refs(list(messages)):
        try:
            data = get(ref) if get is not None else images.get(ref)  # type: ignore[union-attr]
        except OSError as exc:
            raise PromptError(f"no bytes for image {ref!r}: {exc}") from exc
        if data is None:
            raise PromptError(f"no bytes for image {ref!r}")
        try:
            out.append(preprocess_jpeg(data, vision_cfg))
        except (codec.ImgCodecError, ValueError) as exc:
            raise PromptError(f"image {ref!r}: {exc}") from exc
    return out


def build_prompt_ids(tokenizer: Any, vision_cfg: VisionConfig | None, messages: Sequence[dict[str, Any]],
                     images: ImageSource, *, image_token_id: int | None = None,
                     lock: Any = None) -> tuple[list[int], list[ProcessedImage]]:
    """The prompt token ids the model sees for ``messages`` (system message included, generation prompt
    appended) and the preprocessed images in prompt order.

    ``images`` maps each image REF of the messages to its JPEG bytes (or is a function that loads them).
    Raises :class:`PromptError` (a ``ValueError``) for a missing or broken image or a placeholder mismatch.
    """
    processed = load_images(messages, images, vision_cfg)
    tid = image_token_id if image_token_id is not None else image_token_id_of(tokenizer)
    return prompt_ids(tokenizer, messages, [img.num_tokens for img in processed], tid, lock=lock), processed


def prompt_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], image_tokens: Sequence[int], image_token_id: int,
               *, lock: Any = None) -> list[int]:
    """The prompt token ids for ``messages`` when the images take ``image_tokens`` tokens each (in order):
    :func:`build_prompt_ids` without decoding any image (training knows the counts from the JPEG headers,
    :func:`image_token_count`)."""
    return expand_image_pads(chat_token_ids(tokenizer, messages, lock=lock), image_token_id, image_tokens)


def image_token_count(width: int, height: int, vision_cfg: VisionConfig) -> int:
    """How many ``<|image_pad|>`` tokens an image of ``width x height`` takes: the same number as
    ``preprocess_jpeg(...).num_tokens``, from the size alone (a JPEG header is enough)."""
    new_h, new_w = target_size(height, width, vision_cfg)
    p, m = vision_cfg.patch_size, vision_cfg.merge_size
    return (new_h // p) * (new_w // p) // (m * m)


def prompt_sha256(ids: Sequence[int]) -> str:
    """The fingerprint of a prompt: sha256 of its token ids as little-endian int32 bytes (hex)."""
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


