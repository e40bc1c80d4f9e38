"""Set-of-Marks overlay: numbered, coloured boxes drawn in place on an RGB screenshot."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from . import _core

__all__ = ["FILL_ALPHA", "FONT_SCALE", "GLYPHS", "LABEL_PAD", "OUTLINE", "PALETTE", "draw_som", "label_size"]

#: Box colours, indexed by ``id % len(PALETTE)`` (high-contrast, distinguishable hues).
PALETTE: tuple[tuple[int, int, int], ...] = (
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (0, 128, 128),
    (170, 110, 40),
    (128, 0, 0),
    (0, 0, 128),
)

#: Fill opacity in 1/256 units (38/256 ~ 0.15): ``out = (src * (256 - a) + colour * a + 128) >> 8``.
FILL_ALPHA = 38
#: Outline thickness in pixels, drawn inside the box on each edge that lies within the image.
OUTLINE = 2
#: Glyph magnification (5x7 font -> 10x14 pixels) and padding around the label text.
FONT_SCALE = 2
LABEL_PAD = 2

# 5x7 digits, one string of 5 bits per row (MSB = leftmost column).
_FONT_ROWS: dict[str, tuple[int, ...]] = {
    "0": (0b01110, 0b10001, 0b10011, 0b10101, 0b11001, 0b10001, 0b01110),
    "1": (0b00100, 0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110),
    "2": (0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b01000, 0b11111),
    "3": (0b11111, 0b00010, 0b00100, 0b00010, 0b00001, 0b10001, 0b01110),
    "4": (0b00010, 0b00110, 0b01010, 0b10010, 0b11111, 0b00010, 0b00010),
    "5": (0b11111, 0b10000, 0b11110, 0b00001, 0b00001, 0b10001, 0b01110),
    "6": (0b00110, 0b01000, 0b10000, 0b11110, 0b10001, 0b10001, 0b01110),
    "7": (0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b01000, 0b01000),
    "8": (0b01110, 0b10001, 0b10001, 0b01110, 0b10001, 0b10001, 0b01110),
    "9": (0b01110, 0b10001, 0b10001, 0b01111, 0b00001, 0b00010, 0b01100),
}

#: Boolean glyph masks, already magnified by :data:`FONT_SCALE` (``(7 * s, 5 * s)``).
GLYPHS: dict[str, np.ndarray] = {
    ch: np.kron(
        np.array([[(row >> (4 - c)) & 1 for c in range(5)] for row in rows], dtype=bool),
        np.ones((FONT_SCALE, FONT_SCALE), dtype=bool),
    )
    for ch, rows in _FONT_ROWS.items()
}
_GW, _GH, _GAP = 5 * FONT_SCALE, 7 * FONT_SCALE, FONT_SCALE
_PALETTE_U8 = np.array(PALETTE, dtype=np.uint8)
_FONT_U8 = np.stack([GLYPHS[str(d)] for d in range(10)]).astype(np.uint8)


def label_size(text: str) -> tuple[int, int]:
    """Return ``(width, height)`` in pixels of the label (background included) for ``text``."""
    n = len(text)
    return n * _GW + (n - 1) * _GAP + 2 * LABEL_PAD, _GH + 2 * LABEL_PAD


def _text_colour(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    r, g, b = colour
    return (0, 0, 0) if 299 * r + 587 * g + 114 * b > 150_000 else (255, 255, 255)


def draw_som(rgb: np.ndarray, boxes: Iterable[Sequence[int]]) -> None:
    """Draw Set-of-Marks boxes in place on an ``(H, W, 3)`` ``uint8`` RGB array.

    ``boxes`` holds ``(id, x0, y0, x1, y1)`` in pixels (``x1``/``y1`` exclusive; ``id`` a
    non-negative integer). Each box, in order, gets:

    * a translucent fill of the clipped box: ``(src * (256 - FILL_ALPHA) + c * FILL_ALPHA + 128) >> 8``;
    * an :data:`OUTLINE`-pixel opaque outline inside the box on each edge lying within the image
      (an edge outside the image is not drawn at the clipped border);
    * the id in a 5x7 bitmap font scaled x :data:`FONT_SCALE`, on a filled label of the box colour,
      placed just above the box's top-left corner (inside the box if there is no room above) and
      shifted to lie entirely inside the image.

    The colour is ``PALETTE[id % len(PALETTE)]``. Boxes entirely outside the image are skipped.
    A C-contiguous array is drawn on by the C extension with the GIL released; any other writable
    view by an equivalent numpy implementation. Raises :class:`ValueError` for a bad array, a
    negative id or a coordinate outside ``(-2**31, 2**31)``.
    """
    _check_image(rgb)
    rows = [tuple(int(v) for v in box) for box in boxes]
    if any(len(r) != 5 for r in rows):
        raise ValueError("draw_som: each box must be (id, x0, y0, x1, y1)")
    for r in rows:
        if r[0] < 0:
            raise ValueError(f"draw_som: box id must be >= 0 (got {r[0]})")
        if any(not -(2**31) < v < 2**31 for v in r):
            raise ValueError(f"draw_som: box coordinates out of range: {r}")
    if not rgb.flags.c_contiguous:
        _draw_som_numpy(rgb, rows)
        return
    arr = np.array(rows, dtype=np.int64).reshape(-1, 5)
    _core.draw_som(
        rgb, int(rgb.shape[1]), int(rgb.shape[0]), arr, _PALETTE_U8, _FONT_U8,
        _GH, _GW, _GAP, LABEL_PAD, FILL_ALPHA, OUTLINE,
    )  # fmt: skip


def _check_image(rgb: np.ndarray) -> None:
    if not (isinstance(rgb, np.ndarray) and rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3):
        raise ValueError("draw_som expects an (H, W, 3) uint8 numpy array")
    if not rgb.flags.writeable:
        raise ValueError("draw_som: the array is read-only")
    if rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise ValueError("draw_som: empty image")


def _draw_som_numpy(rgb: np.ndarray, boxes: Iterable[Sequence[int]]) -> None:
    """Reference implementation of :func:`draw_som` (numpy; any writable view; no validation of boxes)."""
    _check_image(rgb)
    height, width = int(rgb.shape[0]), int(rgb.shape[1])
    a = FILL_ALPHA
    for box in boxes:
        bid, bx0, by0, bx1, by1 = (int(v) for v in box)
        x0, y0, x1, y1 = max(bx0, 0), max(by0, 0), min(bx1, width), min(by1, height)
        if x1 <= x0 or y1 <= y0:
            continue
        colour = PALETTE[bid % len(PALETTE)]
        col = np.array(colour, dtype=np.uint16)
        region = rgb[y0:y1, x0:x1]
        region[...] = ((region.astype(np.uint16) * (256 - a) + col * a + 128) >> 8).astype(np.uint8)
        t = OUTLINE
        if by0 >= 0:
            rgb[y0 : min(by0 + t, y1), x0:x1] = colour
        if by1 <= height:
            rgb[max(by1 - t, y0) : y1, x0:x1] = colour
        if bx0 >= 0:
            rgb[y0:y1, x0 : min(bx0 + t, x1)] = colour
        if bx1 <= width:
            rgb[y0:y1, max(bx1 - t, x0) : x1] = colour
        _draw_label(rgb, str(bid), colour, bx0, by0)


def _draw_label(rgb: np.ndarray, text: str, colour: tuple[int, int, int], bx0: int, by0: int) -> None:
    height, width = int(rgb.shape[0]), int(rgb.shape[1])
    lw, lh = label_size(text)
    lx = bx0
    ly = by0 - lh if by0 - lh >= 0 else by0
    lx = max(0, min(lx, width - lw))
    ly = max(0, min(ly, height - lh))
    # Label bigger than the image: clip it (top-left anchored).
    rgb[ly : ly + lh, lx : lx + lw] = colour
    fg = _text_colour(colour)
    x = lx + LABEL_PAD
    for ch in text:
        g = GLYPHS[ch]
        gy, gx = ly + LABEL_PAD, x
        sub = rgb[gy : gy + _GH, gx : gx + _GW]
        sub[g[: sub.shape[0], : sub.shape[1]]] = fg
        x += _GW + _GAP
