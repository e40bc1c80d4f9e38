"""Fast JPEG helpers for browser screenshots, built on libjpeg-turbo's TurboJPEG API.

Also: :func:`resize` (area averaging down / bilinear up, in C), :func:`smart_resize` (the Qwen-VL
processors' target-size arithmetic) and :func:`draw_som` (Set-of-Marks boxes drawn in place, in C).

All functions take any object exposing the buffer protocol (``bytes``, ``bytearray``,
``memoryview`` -- e.g. over :class:`multiprocessing.shared_memory.SharedMemory` -- or a
C-contiguous numpy array) without copying it, release the GIL while they work and are safe to
call from several threads at once (TurboJPEG handles are per thread).

Errors:

* :class:`ImgCodecError` (a :class:`ValueError`) for empty, truncated, corrupt or otherwise
  undecodable data, including any libjpeg warning, and for images above :data:`MAX_PIXELS`.
  The message carries TurboJPEG's own error string.
* plain :class:`ValueError` for bad arguments (``scale``, ``quality``, ``subsampling``,
  ``threshold``).
"""

from __future__ import annotations

import math
from typing import TypeAlias, overload

import numpy as np

from . import _core
from ._core import MAX_PIXELS, ImgCodecError
from ._som import PALETTE, draw_som

__all__ = [
    "MAX_PIXELS",
    "PALETTE",
    "QWEN2_VL",
    "QWEN3_VL",
    "SCALES",
    "SUBSAMPLINGS",
    "BytesLike",
    "ImgCodecError",
    "decode",
    "draw_som",
    "encode",
    "frame_diff",
    "jpeg_size",
    "resize",
    "smart_resize",
]

#: Anything exposing a contiguous buffer: bytes, bytearray, memoryview, numpy array, mmap...
BytesLike: TypeAlias = "bytes | bytearray | memoryview | np.ndarray"

#: Supported DCT scaling denominators (decode at 1/scale).
SCALES: tuple[int, ...] = (1, 2, 4, 8)

#: Chroma subsampling modes accepted by :func:`encode`.
SUBSAMPLINGS: tuple[str, ...] = ("444", "422", "420", "440", "411", "gray")


def jpeg_size(buf: BytesLike) -> tuple[int, int]:
    """Return ``(width, height)`` of a JPEG, reading only its header (no decoding).

    Raises :class:`ImgCodecError` if the buffer is empty or has no valid JPEG header.
    """
    return _core.jpeg_size(buf)


def decode(buf: BytesLike, scale: int = 1, *, fast: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a JPEG to an ``(H, W, 3)`` ``uint8`` RGB array.

    ``scale`` (1, 2, 4 or 8) decodes at 1/scale using DCT scaling, which is much cheaper than
    decoding at full size and resizing; the result is ``ceil(height / scale) x
    ceil(width / scale)``. The array is writable and owns its memory (it wraps a fresh
    ``bytearray`` without copying).

    ``fast=True`` selects TurboJPEG's fast integer IDCT and non-smoothed chroma upsampling:
    ~15% faster at full size, off by a grey level or so.

    ``out``, if given, must be a writable C-contiguous ``uint8`` array of exactly the output shape
    ``(ceil(height / scale), ceil(width / scale), 3)`` not overlapping ``buf``; the image is decoded
    straight into it (no intermediate copy) and ``out`` is returned. Its contents are unspecified
    if decoding fails.

    Raises :class:`ImgCodecError` on empty/truncated/corrupt data or an image larger than
    :data:`MAX_PIXELS`, and :class:`ValueError` for an unsupported ``scale`` or a bad ``out``.
    """
    if out is not None:
        if (
            not isinstance(out, np.ndarray)
            or out.dtype != np.uint8
            or out.ndim != 3
            or out.shape[2] != 3
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            desc = (
                f"shape {out.shape} dtype {out.dtype}, c_contiguous={out.flags.c_contiguous}, "
                f"writeable={out.flags.writeable}"
                if isinstance(out, np.ndarray)
                else type(out).__name__
            )
            raise ValueError(f"decode: out must be a writable C-contiguous (H, W, 3) uint8 array, got {desc}")
        _core.decode(buf, scale, fast=fast, out=out)
        return out
    data, width, height = _core.decode(buf, scale, fast=fast)
    return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)


@overload
def encode(
    rgb: np.ndarray, quality: int = ..., subsampling: str = ..., *, fast: bool = ..., out: None = ...
) -> bytes: ...
@overload
def encode(rgb: np.ndarray, quality: int = ..., subsampling: str = ..., *, fast: bool = ..., out: BytesLike) -> int: ...
def encode(
    rgb: np.ndarray, quality: int = 80, subsampling: str = "420", *, fast: bool = False, out: BytesLike | None = None
) -> bytes | int:
    """Encode an ``(H, W, 3)`` ``uint8`` RGB array (or anything numpy can view as one) to JPEG.

    ``quality`` is 1..100; ``subsampling`` is one of :data:`SUBSAMPLINGS` (``"gray"`` writes a
    single-channel JPEG). A C-contiguous input is passed through without copying; a
    non-contiguous view (e.g. a crop) is made contiguous first.

    ``fast=True`` selects TurboJPEG's fast integer forward DCT (``TJFLAG_FASTDCT``): a little
    quicker, marginally less accurate output.

    ``out``, if given, is a writable contiguous buffer (``bytearray``, numpy array, ``memoryview``
    e.g. over :class:`multiprocessing.shared_memory.SharedMemory`) of at least
    ``tjBufSize(W, H, subsampling)`` bytes (the worst-case JPEG size) not overlapping ``rgb``: the
    JPEG is compressed straight into its start (``TJFLAG_NOREALLOC``) and the number of bytes
    written is returned instead of ``bytes``.

    Raises :class:`ImgCodecError` if the input is not ``(H, W, 3)`` ``uint8``, and
    :class:`ValueError` for a bad ``quality`` or ``subsampling``, or an ``out`` that is not writable
    or is smaller than needed (the message gives the size needed).
    """
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ImgCodecError(
            f"encode expects an (H, W, 3) uint8 array, got shape {arr.shape} dtype {arr.dtype}"
        )
    arr = np.ascontiguousarray(arr)
    height, width = int(arr.shape[0]), int(arr.shape[1])
    if out is None:
        return _core.encode(arr, width, height, quality, subsampling, fast=fast)
    return _core.encode(arr, width, height, quality, subsampling, fast=fast, out=out)


def frame_diff(a: BytesLike, b: BytesLike, scale: int = 4, threshold: int = 16) -> tuple[float, float]:
    """Cheaply tell how much two JPEG frames differ (e.g. two screenshots around a browser step).

    Both images are decoded at 1/``scale`` (DCT scaling, fast IDCT/upsampling -- the same for
    both, so the approximation cancels out) and compared in one integer pass. Returns
    ``(changed_fraction, mean_abs_diff)``:

    * ``changed_fraction`` -- fraction of (scaled) pixels whose largest per-channel absolute
      difference is greater than ``threshold`` (0..255), in ``[0, 1]``;
    * ``mean_abs_diff`` -- mean absolute difference over all pixels and channels, in ``[0, 255]``.

    Special cases:

    * frames with different dimensions count as a completely new page: ``(1.0, 255.0)``
      (only the headers are parsed);
    * byte-identical inputs return ``(0.0, 0.0)`` after checking only the first header.

    Raises :class:`ImgCodecError` for undecodable input (the message names image ``a`` or ``b``)
    and :class:`ValueError` for a bad ``scale`` or ``threshold``.
    """
    return _core.frame_diff(a, b, scale, threshold)


def resize(rgb: np.ndarray, width: int, height: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Resize an ``(H, W, 3)`` ``uint8`` C-contiguous RGB array to ``(height, width, 3)``.

    Each axis is filtered on its own: when it shrinks, exact area averaging (a box filter over the
    source interval ``[i * s, (i + 1) * s)``, fractional weights for partly covered pixels); when it
    grows (or stays), bilinear interpolation with half-pixel centres (``x = (i + 0.5) * s - 0.5``,
    clamped at the edges). Integer arithmetic: 14-bit fixed-point weights (exact sums, so flat areas and
    identity resizes stay exact), a small ring of horizontally filtered rows (no full-size temporary)
    and rounding to nearest; results are within one grey level of the exact filter. The GIL is
    released.

    ``out``, if given, must be a writable C-contiguous ``(height, width, 3)`` ``uint8`` array not
    overlapping ``rgb``; it is filled and returned. Raises :class:`ValueError` otherwise.
    """
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError("resize expects an (H, W, 3) uint8 numpy array")
    if not rgb.flags.c_contiguous:
        raise ValueError("resize expects a C-contiguous array (use np.ascontiguousarray)")
    width, height = int(width), int(height)
    if width <= 0 or height <= 0:
        raise ValueError(f"resize: target size must be positive (got {width}x{height})")
    if out is None:
        out = np.empty((height, width, 3), dtype=np.uint8)
    elif (
        not isinstance(out, np.ndarray)
        or out.dtype != np.uint8
        or out.shape != (height, width, 3)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"resize: out must be a writable C-contiguous ({height}, {width}, 3) uint8 array")
    _core.resize(rgb, int(rgb.shape[1]), int(rgb.shape[0]), out, width, height)
    return out


#: ``smart_resize`` keyword arguments of the Qwen2-VL / Qwen2.5-VL image processors (14 px patches,
#: 2x2 merge; ``min_pixels``/``max_pixels`` = ``size["shortest_edge"]``/``size["longest_edge"]``).
QWEN2_VL: dict[str, int] = {"factor": 28, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}
#: The same for Qwen3-VL (16 px patches, 2x2 merge; preprocessor_config ``size`` of the released models).
QWEN3_VL: dict[str, int] = {"factor": 32, "min_pixels": 65536, "max_pixels": 16777216}


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
    """Return the ``(height, width)`` the Qwen-VL image processors resize an image to.

    Both sides become multiples of ``factor``, the area lies within ``[min_pixels, max_pixels]`` and
    the aspect ratio is kept as closely as possible -- the very arithmetic of transformers'
    ``qwen2_vl`` ``smart_resize`` (``round`` is Python's round-half-to-even, as there). Use
    ``smart_resize(h, w, **QWEN3_VL)`` for Qwen3-VL.

    Raises :class:`ValueError`, as transformers does, when the aspect ratio exceeds 200.
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
