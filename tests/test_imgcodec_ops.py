"""Tests for engine._imgcodec's resize, smart_resize and draw_som."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import _imgcodec as ic
from engine._imgcodec import _som, draw_som, resize, smart_resize

# --------------------------------------------------------------------------- resize


def axis_weights(n_in: int, n_out: int) -> np.ndarray:
    """float64 (n_out, n_in) weight matrix of the documented filter along one axis."""
    w = np.zeros((n_out, n_in))
    s = n_in / n_out
    for i in range(n_out):
        if n_out < n_in:  # exact box filter over [i*s, (i+1)*s)
            lo, hi = i * s, (i + 1) * s
            for j in range(int(math.floor(lo)), min(int(math.ceil(hi)), n_in)):
                w[i, j] = (min(j + 1, hi) - max(j, lo)) / s
        else:  # bilinear, half-pixel centres, clamped
            x = min(max((i + 0.5) * s - 0.5, 0.0), n_in - 1)
            j0 = int(math.floor(x))
            j1 = min(j0 + 1, n_in - 1)
            f = x - j0
            w[i, j0] += 1 - f
            w[i, j1] += f
    return w


def ref_resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    wy = axis_weights(img.shape[0], height)
    wx = axis_weights(img.shape[1], width)
    f = img.astype(np.float64)
    return np.stack([wy @ f[..., c] @ wx.T for c in range(3)], axis=-1)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def test_weights_sum_to_one() -> None:
    for n_in, n_out in [(1280, 1288), (1280, 644), (768, 252), (7, 3), (3, 7), (5, 5)]:
        np.testing.assert_allclose(axis_weights(n_in, n_out).sum(axis=1), 1.0)


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([127 + 100 * np.sin(x / 17), 255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1)], axis=-1)
    img = base + rng.normal(0, 25, (h, w, 3))
    img[h // 3 : h // 2, w // 4 : w // 2] = (20, 200, 40)  # hard edges
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((768, 1280), (252, 420)),  # down by ~3.05
        ((768, 1280), (756, 1288)),  # mixed: smart_resize grid of a 1280x768 screenshot
        ((768, 1280), (448, 812)),  # down by non-integer factors
        ((768, 1280), (384, 640)),  # down by exactly 2
        ((100, 150), (237, 333)),  # up
        ((100, 150), (40, 400)),  # down rows, up columns
        ((57, 91), (57, 91)),  # identity
        ((33, 47), (1, 1)),  # to a single pixel
        ((1, 1), (5, 9)),  # from a single pixel
    ],
)
def test_resize_matches_float_reference(src: tuple[int, int], dst: tuple[int, int]) -> None:
    img = _image(*src)
    out = resize(img, dst[1], dst[0])
    assert out.shape == (*dst, 3) and out.dtype == np.uint8
    ref = ref_resize(img, dst[1], dst[0])
    assert psnr(out, ref) >= 40.0
    assert np.abs(out.astype(np.float64) - ref).max() <= 1.0  # 14-bit fixed-point weights, then rounding


def test_resize_identity_exact_and_box_mean() -> None:
    img = _image(64, 96, seed=3)
    np.testing.assert_array_equal(resize(img, 96, 64), img)
    half = resize(img, 48, 32)
    mean = img.astype(np.float64).reshape(32, 2, 48, 2, 3).mean(axis=(1, 3))
    assert np.abs(half - mean).max() <= 0.5 + 1e-3


def test_resize_upscale_columns_and_edges() -> None:
    # Bilinear columns: the SSE2 two-tap path, including the last pixels of the image (scalar fallback).
    img = _image(3, 64, seed=7)
    out = resize(img, 301, 3).astype(np.int64)
    ref = ref_resize(img, 301, 3)
    assert np.abs(out - ref).max() <= 1.0
    assert (out[:, -1] == img[:, -1]).all() and (out[:, 0] == img[:, 0]).all()  # clamped edges


def test_resize_constant_stays_constant() -> None:
    img = np.full((37, 53, 3), (12, 200, 255), np.uint8)
    for w, h in [(10, 7), (53, 37), (200, 91), (31, 70)]:
        out = resize(img, w, h)
        assert (out == np.array([12, 200, 255], np.uint8)).all()


def test_resize_out_buffer() -> None:
    img = _image(80, 120)
    out = np.zeros((30, 50, 3), np.uint8)
    res = resize(img, 50, 30, out=out)
    assert res is out
    np.testing.assert_array_equal(out, resize(img, 50, 30))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"out": np.zeros((30, 51, 3), np.uint8)},
        {"out": np.zeros((30, 50, 3), np.float32)},
        {"out": np.zeros((30, 100, 3), np.uint8)[:, ::2]},
    ],
)
def test_resize_bad_out(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        resize(_image(80, 120), 50, 30, **kwargs)


def test_resize_bad_args() -> None:
    img = _image(20, 30)
    with pytest.raises(ValueError):
        resize(img, 0, 10)
    with pytest.raises(ValueError):
        resize(img.astype(np.float32), 10, 10)
    with pytest.raises(ValueError):
        resize(img[:, ::2], 10, 10)
    with pytest.raises(ValueError):
        resize(img[..., 0], 10, 10)
    with pytest.raises(ValueError):  # overlapping buffers, via the raw entry point
        ic._core.resize(img, 30, 20, img, 30, 20)
    with pytest.raises(ValueError):  # wrong byte count
        ic._core.resize(img, 31, 20, np.empty((5, 5, 3), np.uint8), 5, 5)
    with pytest.raises(TypeError):  # read-only destination
        ic._core.resize(img, 30, 20, bytes(75), 5, 5)


def test_resize_threads() -> None:
    img = _image(300, 500)
    want = resize(img, 173, 111)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                np.testing.assert_array_equal(resize(img, 173, 111), want)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# --------------------------------------------------------------------------- smart_resize

_SIZES = sorted({*range(1, 80, 3), *range(80, 1200, 37), 1200, 1280, 1288, 1920, 2048, 3000, 4096, 7000, 11000})


@pytest.fixture(scope="module")
def hf_smart_resize():
    pytest.importorskip("transformers")
    try:  # transformers 5: the PIL backend module imports without torch
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as fn
    except ImportError:  # transformers 4.x
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as fn
    return fn


@pytest.mark.parametrize(
    "params", [ic.QWEN2_VL, ic.QWEN3_VL, {"factor": 28, "min_pixels": 3136, "max_pixels": 12845056}]
)
def test_smart_resize_matches_transformers(hf_smart_resize, params: dict[str, int]) -> None:
    checked = errors = 0
    for h in _SIZES:
        for w in _SIZES:
            try:
                want = hf_smart_resize(h, w, **params)
            except ValueError as e:
                with pytest.raises(ValueError, match="aspect ratio"):
                    smart_resize(h, w, **params)
                assert "aspect ratio" in str(e)
                errors += 1
                continue
            assert smart_resize(h, w, **params) == tuple(want), (h, w, params)
            checked += 1
    assert checked > 2000 and errors > 10


def test_smart_resize_defaults(hf_smart_resize) -> None:
    assert smart_resize(768, 1280) == (756, 1288) == tuple(hf_smart_resize(768, 1280))
    h, w = smart_resize(768, 1280, **ic.QWEN3_VL)
    assert h % 32 == 0 and w % 32 == 0
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2011)
    assert smart_resize(10, 2000) == tuple(hf_smart_resize(10, 2000))


# --------------------------------------------------------------------------- draw_som

A = _som.FILL_ALPHA


def blend(src: np.ndarray, col: tuple[int, int, int]) -> np.ndarray:
    return ((src.astype(np.int64) * (256 - A) + np.array(col) * A + 128) >> 8).astype(np.uint8)


def canvas(h: int = 200, w: int = 300) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 3) % 256, (y * 5) % 256, ((x + y) * 7) % 256], axis=-1).astype(np.uint8)


def test_som_outline_fill_and_label() -> None:
    img = canvas()
    orig = img.copy()
    bid, x0, y0, x1, y1 = 7, 50, 60, 150, 140
    draw_som(img, [(bid, x0, y0, x1, y1)])
    col = ic.PALETTE[bid % len(ic.PALETTE)]
    # outline: 2 px inside each edge, opaque
    for y, x in [
        (y0, x0 + 50),
        (y0 + 1, x0 + 50),
        (y1 - 1, x0 + 50),
        (y1 - 2, x0 + 50),
        (y0 + 40, x0),
        (y0 + 40, x0 + 1),
        (y0 + 40, x1 - 1),
        (y0 + 40, x1 - 2),
        (y1 - 1, x1 - 1),
    ]:
        assert tuple(img[y, x]) == col, (y, x)
    # fill: inside the outline, exactly the blend formula
    inner = (slice(y0 + 2, y1 - 2), slice(x0 + 2, x1 - 2))
    np.testing.assert_array_equal(img[inner], blend(orig[inner], col))
    # outside the box and label: untouched
    lw, lh = _som.label_size("7")
    assert np.array_equal(img[y1:], orig[y1:])
    assert np.array_equal(img[:, x1:], orig[:, x1:])
    assert np.array_equal(img[: y0 - lh], orig[: y0 - lh])
    assert np.array_equal(img[y0 - lh : y0, x0 + lw : x1], orig[y0 - lh : y0, x0 + lw : x1])
    # label: above the top-left corner, background colour plus the glyph in the contrasting colour
    label = img[y0 - lh : y0, x0 : x0 + lw]
    glyph = _som.GLYPHS["7"]
    p = _som.LABEL_PAD
    fg = _som._text_colour(col)
    inner_label = label[p : p + glyph.shape[0], p : p + glyph.shape[1]]
    assert (inner_label[glyph] == fg).all()
    assert (inner_label[~glyph] == col).all()
    assert (label[:p] == col).all() and (label[:, :p] == col).all()
    assert glyph.shape == (14, 10) and glyph.sum() > 20


def test_som_label_digits_and_colour_by_id() -> None:
    img = np.zeros((100, 200, 3), np.uint8)
    draw_som(img, [(123, 20, 50, 180, 90)])
    lw, lh = _som.label_size("123")
    assert lw == 3 * 10 + 2 * 2 + 4 and lh == 14 + 4
    col = ic.PALETTE[123 % len(ic.PALETTE)]
    fg = _som._text_colour(col)
    label = img[50 - lh : 50, 20 : 20 + lw]
    p = _som.LABEL_PAD
    for k, ch in enumerate("123"):
        x = p + k * 12
        sub = label[p : p + 14, x : x + 10]
        g = _som.GLYPHS[ch]
        assert (sub[g] == fg).all() and (sub[~g] == col).all()
    # same id -> same colour; different ids from the palette differ
    assert ic.PALETTE[3] != ic.PALETTE[4]
    img2 = np.zeros_like(img)
    draw_som(img2, [(123, 20, 50, 180, 90)])
    assert np.array_equal(img, img2)


def test_som_box_partly_outside() -> None:
    img = canvas(100, 120)
    orig = img.copy()
    draw_som(img, [(2, -30, -40, 60, 50)])  # top/left edges outside the image
    col = ic.PALETTE[2]
    lw, lh = _som.label_size("2")
    # the visible right and bottom edges get the outline
    assert (img[10:50, 58:60] == col).all()
    assert (img[48:50, 30:60] == col).all()
    # no outline at the clipped top/left borders: pixels there (below/after the label) are blended
    np.testing.assert_array_equal(img[lh:48, 0:2], blend(orig[lh:48, 0:2], col))
    np.testing.assert_array_equal(img[0:2, lw:58], blend(orig[0:2, lw:58], col))
    # label clamped into the top-left corner
    assert (img[0:lh, 0:lw][:2] == col).all()
    # outside the box untouched
    assert np.array_equal(img[50:], orig[50:]) and np.array_equal(img[:, 60:], orig[:, 60:])


def test_som_label_clamped_at_borders() -> None:
    img = np.zeros((60, 80, 3), np.uint8)
    lw, lh = _som.label_size("45")
    draw_som(img, [(45, 75, 5, 79, 30)])  # label at the right border, no room above
    col = ic.PALETTE[45 % len(ic.PALETTE)]
    assert (img[5 : 5 + 2, 80 - lw : 80] == col).all()  # label inside the box's top, shifted left
    assert (img[5 : 5 + lh, 80 - lw : 80 - lw + 2] == col).all()
    img = np.zeros((60, 80, 3), np.uint8)
    draw_som(img, [(9, 10, 58, 30, 70)])  # box at the bottom: label above it
    lw, lh = _som.label_size("9")
    assert (img[58 - lh : 58 - lh + 2, 10 : 10 + lw] == ic.PALETTE[9]).all()
    img = np.zeros((12, 12, 3), np.uint8)
    draw_som(img, [(1, 2, 2, 10, 10)])  # label larger than the image: clipped, no error
    assert (img[0, 0] == ic.PALETTE[1]).all()


def test_som_skips_outside_and_validates() -> None:
    img = canvas(50, 50)
    orig = img.copy()
    draw_som(img, [(1, 60, 60, 90, 90), (2, -20, 0, -1, 10), (3, 10, 10, 10, 30)])
    assert np.array_equal(img, orig)
    with pytest.raises(ValueError):
        draw_som(img, [(-1, 0, 0, 10, 10)])
    with pytest.raises(ValueError):
        draw_som(img.astype(np.float32), [])
    ro = img.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        draw_som(ro, [])


@pytest.mark.parametrize(("h", "w", "seed"), [(768, 1280, 0), (50, 40, 1), (13, 9, 2), (300, 17, 3)])
def test_som_c_matches_numpy_reference(h: int, w: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    boxes = []
    for _ in range(60):
        x0 = int(rng.integers(-w // 2, w + 5))
        y0 = int(rng.integers(-h // 2, h + 5))
        boxes.append(
            (int(rng.integers(0, 100_000)), x0, y0, x0 + int(rng.integers(-3, w)), y0 + int(rng.integers(-3, h)))
        )
    img = canvas(h, w)
    ref = img.copy()
    draw_som(img, boxes)  # C path
    _som._draw_som_numpy(ref, boxes)
    np.testing.assert_array_equal(img, ref)
    # a non-contiguous view goes through the numpy path and gives the same pixels
    big = np.zeros((h, 2 * w, 3), np.uint8)
    view = big[:, ::2]
    view[...] = canvas(h, w)
    draw_som(view, boxes)
    np.testing.assert_array_equal(view, ref)


def test_som_rejects_bad_boxes() -> None:
    img = canvas(20, 20)
    with pytest.raises(ValueError):
        draw_som(img, [(1, 0, 0, 2**31, 5)])
    with pytest.raises(ValueError):
        draw_som(img, [(1, 0, 0, 5)])
    draw_som(img, [])  # nothing to do
    draw_som(img, np.array([[3, 1, 1, 8, 8]]))  # numpy rows are fine


# --------------------------------------------------------------------------- fuzz (also run under ASan)

_dim = st.integers(1, 40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hi=_dim, wi=_dim, ho=_dim, wo=_dim, seed=st.integers(0, 2**16))
def test_fuzz_resize(hi: int, wi: int, ho: int, wo: int, seed: int) -> None:
    img = np.random.default_rng(seed).integers(0, 256, (hi, wi, 3), dtype=np.uint8)
    out = resize(img, wo, ho)
    assert np.abs(out.astype(np.float64) - ref_resize(img, wo, ho)).max() <= 1.0


_coord = st.integers(-60, 60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    h=_dim,
    w=_dim,
    boxes=st.lists(st.tuples(st.integers(0, 10**9), _coord, _coord, _coord, _coord), max_size=8),
)
def test_fuzz_som(h: int, w: int, boxes: list[tuple[int, int, int, int, int]]) -> None:
    img = canvas(h, w)
    ref = img.copy()
    draw_som(img, boxes)
    _som._draw_som_numpy(ref, boxes)
    np.testing.assert_array_equal(img, ref)
