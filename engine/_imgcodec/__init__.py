"""Fast JPEG helpers for browser screenshots, built on libjpeg-turbo's TurboJPEG API.

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

from typing import TypeAlias

import numpy as np

from . import _core
from ._core import MAX_PIXELS, ImgCodecError

__all__ = [
    "MAX_PIXELS",
    "SCALES",
    "SUBSAMPLINGS",
    "BytesLike",
    "ImgCodecError",
    "decode",
    "encode",
    "frame_diff",
    "jpeg_size",
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


def decode(buf: BytesLike, scale: int = 1, *, fast: bool = False) -> np.ndarray:
    """Decode a JPEG to an ``(H, W, 3)`` ``uint8`` RGB array.

    ``scale`` (1, 2, 4 or 8) decodes at 1/scale using DCT scaling, which is much cheaper than
    decoding at full size and resizing; the result is ``ceil(height / scale) x
    ceil(width / scale)``. The array is writable and owns its memory (it wraps a fresh
    ``bytearray`` without copying).

    ``fast=True`` selects TurboJPEG's fast integer IDCT and non-smoothed chroma upsampling:
    ~15% faster at full size, off by a grey level or so.

    Raises :class:`ImgCodecError` on empty/truncated/corrupt data or an image larger than
    :data:`MAX_PIXELS`, and :class:`ValueError` for an unsupported ``scale``.
    """
    data, width, height = _core.decode(buf, scale, fast=fast)
    return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)


def encode(rgb: np.ndarray, quality: int = 80, subsampling: str = "420") -> bytes:
    """Encode an ``(H, W, 3)`` ``uint8`` RGB array (or anything numpy can view as one) to JPEG.

    ``quality`` is 1..100; ``subsampling`` is one of :data:`SUBSAMPLINGS` (``"gray"`` writes a
    single-channel JPEG). A C-contiguous input is passed through without copying; a
    non-contiguous view (e.g. a crop) is made contiguous first.

    Raises :class:`ImgCodecError` if the input is not ``(H, W, 3)`` ``uint8``, and
    :class:`ValueError` for a bad ``quality`` or ``subsampling``.
    """
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ImgCodecError(
            f"encode expects an (H, W, 3) uint8 array, got shape {arr.shape} dtype {arr.dtype}"
        )
    arr = np.ascontiguousarray(arr)
    height, width = int(arr.shape[0]), int(arr.shape[1])
    return _core.encode(arr, width, height, quality, subsampling)


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
