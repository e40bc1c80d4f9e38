"""The worker's image work on screenshots, on the compiled codec (``engine._imgcodec``, loaded only when needed):
how much of the page changed between two captures, Set-of-Marks boxes drawn on, PNG decoding and encoding."""

from __future__ import annotations

from typing import Any

# The least change reported for captures that differ at all (Observation.change).
MIN_CHANGE = 1e-6


def _changed_fraction(before: bytes, after: bytes) -> float | None:
    """How much of the page changed between two screenshots (in a thread: the codec releases the GIL): 0.0 only for
    byte-identical captures (Chromium encodes an unchanged page to the same bytes), else at least MIN_CHANGE, so
    that any difference counts as a change, as the original's exact comparison of the frames has it (a word typed
    into a search box changes well under 0.1% of the pixels)."""
    if before == after:
        return 0.0
    from engine import _imgcodec as imgcodec

    try:
        return max(imgcodec.frame_diff(before, after)[0], MIN_CHANGE)
    except imgcodec.ImgCodecError:
        return None


def _draw_marks(image: bytes, elements: list[list[Any]], css_width: float, quality: int, fmt: str = "jpeg") -> bytes:
    """The screenshot with the elements drawn on as numbered boxes by the compiled codec (run in a thread: it
    releases the GIL); the same format as it came. Screenshot pixels per CSS px are measured, not assumed
    (zoom, device scale factor)."""
    from engine import _imgcodec as imgcodec  # here: a worker that never draws does not load numpy

    img = imgcodec.decode(image) if fmt == "jpeg" else _png_pixels(image)
    s = img.shape[1] / css_width if css_width > 0 else 1.0
    imgcodec.draw_som(img, [(e[0], round(e[3] * s), round(e[4] * s), round((e[3] + e[5]) * s),
                             round((e[4] + e[6]) * s)) for e in elements])
    return imgcodec.encode(img, quality) if fmt == "jpeg" else _png_bytes(img)


def _png_pixels(png: bytes) -> Any:
    """A PNG as a writable (H, W, 3) uint8 array (PNG captures are for clients that ask for them only)."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.array(im.convert("RGB"))


def _png_bytes(img: Any) -> bytes:
    """An (H, W, 3) uint8 array as PNG (the fastest zlib level: these are sent, not archived)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG", compress_level=1)
    return buf.getvalue()
