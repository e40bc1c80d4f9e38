"""Qwen-VL image preprocessing on the project's compiled codec: JPEG bytes to ``pixel_values``.

The steps and the memory layout are those of transformers' ``Qwen2VLImageProcessor`` (also used by
Qwen2.5-VL and Qwen3-VL): resize to :func:`engine._imgcodec.smart_resize`'s size (multiples of
``patch_size * merge_size``, area within ``[min_pixels, max_pixels]``), rescale by 1/255, normalise
with the model's mean/std, then cut into ``patch_size`` squares, grouped ``merge_size x merge_size``
(the order the vision tower's patch merger expects), each patch repeated ``temporal_patch_size``
times (a still image is a one-frame video). One image gives ``grid_h * grid_w`` rows of
``3 * temporal_patch_size * patch_size**2`` floats and ``grid_h * grid_w // merge_size**2`` LLM tokens.

The one deliberate difference: the resize is the codec's (area averaging when shrinking, bilinear when
growing; in C, without the GIL), not PIL's bicubic. Given the same resized image, the output equals
transformers' to float32 rounding (``tests/test_hf_backend.py`` checks it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine import _imgcodec as codec

_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The defaults of VisionConfig's pixel bounds, here too for from_dict: a slots dataclass keeps no class-level
# default (``VisionConfig.min_pixels`` is the slot's descriptor).
_MIN_PIXELS = 56 * 56
_MAX_PIXELS = 28 * 28 * 1280


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """What preprocessing needs from a model's ``preprocessor_config.json``."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = _MIN_PIXELS
    max_pixels: int = _MAX_PIXELS
    image_mean: tuple[float, float, float] = _OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = _OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this (one merged patch)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Floats per row of ``pixel_values``."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> VisionConfig:
        """Read a ``preprocessor_config.json`` dict. ``min_pixels``/``max_pixels`` win over ``size``, as in
        transformers' processor constructor (the released Qwen2-VL configs carry both, Qwen3-VL's only
        ``size``)."""
        size = cfg.get("size") or {}
        min_pixels = cfg.get("min_pixels") or size.get("shortest_edge") or _MIN_PIXELS
        max_pixels = cfg.get("max_pixels") or size.get("longest_edge") or _MAX_PIXELS
        return cls(
            patch_size=int(cfg.get("patch_size", 14)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", 2)),
            merge_size=int(cfg.get("merge_size", 2)),
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            image_mean=tuple(float(x) for x in cfg.get("image_mean", _OPENAI_CLIP_MEAN)),  # type: ignore[arg-type]
            image_std=tuple(float(x) for x in cfg.get("image_std", _OPENAI_CLIP_STD)),  # type: ignore[arg-type]
            rescale_factor=float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else 1.0,
        )


def load_vision_config(model_dir: str | Path) -> VisionConfig:
    """The :class:`VisionConfig` of the model directory ``model_dir`` (its ``preprocessor_config.json``)."""
    path = Path(model_dir) / "preprocessor_config.json"
    return VisionConfig.from_dict(json.loads(path.read_text()))


def vision_config_of(model_dir: str | Path) -> VisionConfig | None:
    """The model's :class:`VisionConfig`, or None for a text-only model (a directory without an image processor's
    ``preprocessor_config.json``: its prompts have no images)."""
    return load_vision_config(model_dir) if (Path(model_dir) / "preprocessor_config.json").exists() else None


def resize_of(vision: VisionConfig | None) -> dict[str, int] | None:
    """The smart_resize parameters of an image processor (None for a text-only model)."""
    if vision is None:
        return None
    return {"factor": vision.factor, "min_pixels": vision.min_pixels, "max_pixels": vision.max_pixels}


@dataclass(slots=True)
class ProcessedImage:
    """One image, ready for the vision tower."""

    pixel_values: np.ndarray  # (grid_h * grid_w, patch_dim) float32
    grid_thw: tuple[int, int, int]
    merge_size: int

    @property
    def num_tokens(self) -> int:
        """How many ``<|image_pad|>`` tokens the image takes in the prompt."""
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size * self.merge_size)


def target_size(height: int, width: int, cfg: VisionConfig) -> tuple[int, int]:
    """``(height, width)`` an image of this size is resized to for the model."""
    return codec.smart_resize(height, width, factor=cfg.factor, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)


def resize_for_model(jpeg: codec.BytesLike, cfg: VisionConfig) -> np.ndarray:
    """Decode ``jpeg`` and resize it to the model's grid: an ``(H, W, 3)`` ``uint8`` RGB array.

    Raises :class:`engine._imgcodec.ImgCodecError` (a ``ValueError``) for undecodable bytes.
    """
    rgb = codec.decode(jpeg)
    height, width = int(rgb.shape[0]), int(rgb.shape[1])
    new_h, new_w = target_size(height, width, cfg)
    if (new_h, new_w) == (height, width):
        return rgb
    return codec.resize(rgb, new_w, new_h)


def patchify(rgb: np.ndarray, cfg: VisionConfig) -> ProcessedImage:
    """Rescale, normalise and patchify an ``(H, W, 3)`` ``uint8`` image whose sides are multiples of
    ``cfg.factor`` (the output of :func:`resize_for_model`), in transformers' layout."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"patchify expects an (H, W, 3) uint8 array, got {rgb.shape} {rgb.dtype}")
    height, width = int(rgb.shape[0]), int(rgb.shape[1])
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    if height % cfg.factor or width % cfg.factor:
        raise ValueError(f"image {width}x{height} is not a multiple of {cfg.factor} (resize it first)")
    grid_h, grid_w = height // p, width // p
    # (H, W, C) -> (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, mh, mw, C, ph, pw): transformers' order of
    # rows (merge groups, row-major; patches inside a group, row-major) and of the values inside a row
    # (channel, then temporal copy, then pixel row, then pixel column).
    blocks = rgb.reshape(grid_h // m, m, p, grid_w // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
    # Rescale and normalise in one fused multiply-add per value: (x / 255 - mean) / std.
    std = np.asarray(cfg.image_std, dtype=np.float64)
    scale = (cfg.rescale_factor / std).astype(np.float32).reshape(1, 1, 1, 1, 3, 1, 1)
    offset = (-np.asarray(cfg.image_mean, dtype=np.float64) / std).astype(np.float32).reshape(1, 1, 1, 1, 3, 1, 1)
    normed = blocks.astype(np.float32)
    normed *= scale
    normed += offset
    frames = np.broadcast_to(normed[:, :, :, :, :, None], (*normed.shape[:5], t, p, p))
    pixel_values = np.ascontiguousarray(frames).reshape(grid_h * grid_w, 3 * t * p * p)
    return ProcessedImage(pixel_values=pixel_values, grid_thw=(1, grid_h, grid_w), merge_size=m)


def preprocess_jpeg(jpeg: codec.BytesLike, cfg: VisionConfig) -> ProcessedImage:
    """JPEG bytes -> :class:`ProcessedImage` (decode, resize, normalise, patchify).

    Raises :class:`engine._imgcodec.ImgCodecError` (a ``ValueError``) for undecodable bytes.
    """
    return patchify(resize_for_model(jpeg, cfg), cfg)


def stack_images(images: Sequence[ProcessedImage]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate images (in prompt order) into ``pixel_values`` ``(sum patches, patch_dim)`` and
    ``image_grid_thw`` ``(n, 3)`` int64, the model's inputs for a prompt or a batch."""
    if not images:
        raise ValueError("stack_images needs at least one image")
    pixel_values = np.concatenate([img.pixel_values for img in images], axis=0)
    grid_thw = np.asarray([img.grid_thw for img in images], dtype=np.int64)
    return pixel_values, grid_thw
