"""Tests for engine._imgcodec (TurboJPEG C extension)."""

from __future__ import annotations

import io
import math
import re
import threading
from multiprocessing import shared_memory

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from engine import _imgcodec as ic
from engine._imgcodec import ImgCodecError, decode, encode, frame_diff, jpeg_size

# --------------------------------------------------------------------------- helpers


def smooth_image(h: int, w: int) -> np.ndarray:
    """Smooth synthetic RGB image (gradients and low-frequency waves)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127.5 + 100 * np.sin(x / max(w, 1) * 2 * np.pi) * np.cos(y / max(h, 1) * np.pi)
    g = 255.0 * x / max(w - 1, 1)
    b = 255.0 * y / max(h - 1, 1)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def page_image(h: int = 768, w: int = 1280, seed: int = 0) -> np.ndarray:
    """Web-page-like RGB image: white background, nav bar, text lines, buttons, a picture."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 255, np.uint8)
    img[: h // 12] = (32, 33, 36)  # dark nav bar
    img[h // 12 : h // 12 + 2] = (220, 220, 220)
    # "text": short dark runs on regularly spaced lines in a left column
    for top in range(h // 8, h - 20, 22):
        x = 40
        while x < w // 2:
            glyph_w = int(rng.integers(4, 9))
            if rng.random() < 0.8:
                img[top : top + 12, x : x + glyph_w] = rng.integers(0, 90)
            x += glyph_w + (int(rng.integers(6, 14)) if rng.random() < 0.15 else 2)
    # buttons
    for i in range(4):
        y0 = h // 6 + i * 70
        img[y0 : y0 + 40, w // 2 + 60 : w // 2 + 260] = (26, 115, 232)
        img[y0 + 14 : y0 + 26, w // 2 + 90 : w // 2 + 230] = 255
    # a photo-like block
    ph, pw = h // 3, w // 3
    photo = smooth_image(ph, pw).astype(np.int16) + rng.integers(-20, 21, (ph, pw, 3))
    my, mx = h // 25, w // 32
    img[h - ph - my : h - my, w - pw - mx : w - mx] = np.clip(photo, 0, 255).astype(np.uint8)
    return img


def pil_encode(rgb: np.ndarray, quality: int = 85, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=quality, **kw)
    return out.getvalue()


def pil_decode(jpeg: bytes, scale: int = 1) -> np.ndarray:
    """Pillow's decode at 1/scale, using libjpeg DCT scaling via draft() (which wants a floor size)."""
    im = Image.open(io.BytesIO(jpeg))
    if scale != 1:
        im.draft("RGB", (im.width // scale, im.height // scale))
    return np.asarray(im.convert("RGB"))


def mad(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def with_comment(jpeg: bytes, text: bytes = b"hello") -> bytes:
    """Same image, different bytes: insert a COM segment right after SOI."""
    seg = b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text
    return jpeg[:2] + seg + jpeg[2:]


def tables_only(jpeg: bytes) -> bytes:
    """An abbreviated 'tables-only' stream: SOI, the DQT/DHT segments, EOI (valid JPEG, no image)."""
    out, i = bytearray(jpeg[:2]), 2
    while jpeg[i] == 0xFF and jpeg[i + 1] != 0xDA:
        seg_len = int.from_bytes(jpeg[i + 2 : i + 4], "big")
        if jpeg[i + 1] in (0xDB, 0xC4):
            out += jpeg[i : i + 2 + seg_len]
        i += 2 + seg_len
    return bytes(out + b"\xff\xd9")


def patch_sof_size(jpeg: bytes, width: int, height: int) -> bytes:
    i = jpeg.index(b"\xff\xc0")  # baseline SOF0: FFC0 len(2) precision(1) height(2) width(2)
    return jpeg[: i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + jpeg[i + 9 :]


SMALL = smooth_image(48, 64)
SMALL_JPEG = encode(SMALL, quality=90)
SMALL_PIL_PROGRESSIVE = pil_encode(page_image(40, 56, seed=3), quality=75, progressive=True)
PAGE = page_image()
PAGE_JPEG = encode(PAGE, quality=80)


# --------------------------------------------------------------------------- jpeg_size


@pytest.mark.parametrize("w,h", [(1, 1), (7, 5), (64, 48), (333, 17), (1280, 768), (17, 1001)])
def test_jpeg_size(w: int, h: int) -> None:
    img = smooth_image(h, w)
    assert jpeg_size(encode(img)) == (w, h)
    assert jpeg_size(pil_encode(img)) == (w, h)
    assert jpeg_size(pil_encode(img, progressive=True)) == (w, h)


# --------------------------------------------------------------------------- decode


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
@pytest.mark.parametrize("w,h", [(203, 131), (1280, 768), (37, 29)])
def test_decode_matches_pillow(scale: int, w: int, h: int) -> None:
    img = page_image(h, w, seed=w)
    for jpeg in (encode(img, quality=85), pil_encode(img, quality=85, subsampling=0)):
        ours = decode(jpeg, scale=scale)
        assert ours.dtype == np.uint8
        assert ours.shape == (math.ceil(h / scale), math.ceil(w / scale), 3)
        ref = pil_decode(jpeg, scale)
        assert ref.shape == ours.shape
        assert mad(ours, ref) < 2.0


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_decode_fast_mode_is_close(scale: int) -> None:
    accurate = decode(PAGE_JPEG, scale=scale)
    fast = decode(PAGE_JPEG, scale=scale, fast=True)
    assert fast.shape == accurate.shape
    assert mad(fast, accurate) < 1.5


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_decode_scaled_shapes_small_images(scale: int) -> None:
    for w in (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33):
        for h in (1, 5, 8, 13, 24):
            for subsampling in ("444", "420", "gray"):
                jpeg = encode(smooth_image(h, w), subsampling=subsampling)
                assert decode(jpeg, scale=scale).shape == (math.ceil(h / scale), math.ceil(w / scale), 3)


@pytest.mark.parametrize("subsampling", ic.SUBSAMPLINGS)
def test_decode_subsamplings(subsampling: str) -> None:
    img = smooth_image(50, 70)
    jpeg = encode(img, quality=95, subsampling=subsampling)
    out = decode(jpeg)
    assert out.shape == (50, 70, 3)
    if subsampling == "gray":
        assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
    else:
        assert psnr(img, out) > 30


def test_decode_result_is_writable_and_owned() -> None:
    out = decode(SMALL_JPEG)
    out[0, 0] = (1, 2, 3)
    assert tuple(out[0, 0]) == (1, 2, 3)
    base = out
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    assert isinstance(base, bytearray)


def test_roundtrip_psnr_q90() -> None:
    img = smooth_image(240, 320)
    jpeg = encode(img, quality=90)
    assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9"
    assert psnr(img, decode(jpeg)) >= 30.0
    assert psnr(img, pil_decode(jpeg)) >= 30.0  # readable by other decoders
    assert psnr(img, decode(encode(img, quality=90, subsampling="444"))) >= 30.0


def test_encode_accepts_noncontiguous_view() -> None:
    crop = PAGE[100:200:2, 300:500]
    assert not crop.flags.c_contiguous
    out = decode(encode(crop, quality=95, subsampling="444"))
    assert out.shape == crop.shape
    assert mad(out, crop) < 3.0


def test_encode_quality_changes_size() -> None:
    assert len(encode(PAGE, quality=30)) < len(encode(PAGE, quality=95))


def test_encode_fast_dct() -> None:
    img = smooth_image(240, 320)
    slow, fast = encode(img, quality=90), encode(img, quality=90, fast=True)
    assert fast[:2] == b"\xff\xd8" and fast[-2:] == b"\xff\xd9"
    assert psnr(img, decode(fast)) >= 30.0
    assert psnr(img, pil_decode(fast)) >= 30.0
    assert psnr(decode(slow), decode(fast)) >= 35.0
    # the SoM fast path: fast decode, fast encode
    page = decode(encode(PAGE, quality=80, fast=True), fast=True)
    assert page.shape == PAGE.shape and mad(page, PAGE) < 4.0
    with pytest.raises(TypeError):
        ic._core.encode(img, 320, 240, 90, "420", True)  # fast is keyword-only


# --------------------------------------------------------------------------- frame_diff


def test_frame_diff_identical() -> None:
    assert frame_diff(PAGE_JPEG, PAGE_JPEG) == (0.0, 0.0)
    assert frame_diff(PAGE_JPEG, bytes(PAGE_JPEG)) == (0.0, 0.0)
    # same pixels, different bytes: takes the full decode path
    for scale in (1, 2, 4, 8):
        assert frame_diff(PAGE_JPEG, with_comment(PAGE_JPEG), scale=scale) == (0.0, 0.0)


def test_frame_diff_small_rectangle() -> None:
    changed = PAGE.copy()
    y0, x0, rh, rw = 224, 704, 64, 96  # multiples of 32: block-aligned at 1/4 scale
    changed[y0 : y0 + rh, x0 : x0 + rw] = (255, 0, 128)
    area = rh * rw / (PAGE.shape[0] * PAGE.shape[1])
    for scale in (1, 2, 4, 8):
        frac, mean = frame_diff(PAGE_JPEG, encode(changed, quality=80), scale=scale)
        assert 0.7 * area <= frac <= 1.6 * area, (scale, frac, area)
        assert 0.0 < mean < 5.0


def test_frame_diff_totally_different() -> None:
    other = encode(255 - PAGE, quality=80)
    frac, mean = frame_diff(PAGE_JPEG, other)
    assert frac > 0.9
    assert mean > 150
    noise = np.random.default_rng(1).integers(0, 256, PAGE.shape, dtype=np.uint8)
    frac, mean = frame_diff(encode(np.zeros_like(PAGE)), encode(np.full_like(PAGE, 255)))
    assert frac == 1.0 and mean > 250
    frac, _ = frame_diff(PAGE_JPEG, encode(noise))
    assert frac > 0.9


def test_frame_diff_threshold() -> None:
    a = encode(np.full((64, 64, 3), 100, np.uint8), quality=100, subsampling="444")
    b = encode(np.full((64, 64, 3), 110, np.uint8), quality=100, subsampling="444")
    frac_low, mean = frame_diff(a, b, threshold=5)
    frac_high, mean2 = frame_diff(a, b, threshold=20)
    assert frac_low == 1.0 and frac_high == 0.0
    assert mean == mean2 and 9.0 <= mean <= 11.0


def test_frame_diff_different_sizes() -> None:
    assert frame_diff(PAGE_JPEG, encode(PAGE[:-8])) == (1.0, 255.0)
    assert frame_diff(SMALL_JPEG, PAGE_JPEG) == (1.0, 255.0)


# --------------------------------------------------------------------------- buffer inputs


def test_buffer_inputs_without_copy() -> None:
    jpeg = PAGE_JPEG
    arr = np.frombuffer(jpeg, dtype=np.uint8)
    for buf in (jpeg, bytearray(jpeg), memoryview(jpeg), arr, memoryview(b"xx" + jpeg)[2:]):
        assert jpeg_size(buf) == (1280, 768)
        assert decode(buf, scale=8).shape == (96, 160, 3)
        assert frame_diff(buf, jpeg) == (0.0, 0.0)


def test_shared_memory_input() -> None:
    jpeg = PAGE_JPEG
    other = encode(page_image(seed=5))
    shm = shared_memory.SharedMemory(create=True, size=len(jpeg) + len(other) + 100)
    try:
        shm.buf[: len(jpeg)] = jpeg
        shm.buf[len(jpeg) : len(jpeg) + len(other)] = other
        view_a = shm.buf[: len(jpeg)]
        view_b = shm.buf[len(jpeg) : len(jpeg) + len(other)]
        try:
            assert jpeg_size(view_a) == (1280, 768)
            np.testing.assert_array_equal(decode(view_a), decode(jpeg))
            np.testing.assert_array_equal(decode(view_b, scale=2), decode(other, scale=2))
            assert frame_diff(view_a, view_b) == frame_diff(jpeg, other)
            assert frame_diff(view_a, jpeg) == (0.0, 0.0)
        finally:
            view_a.release()
            view_b.release()
    finally:
        shm.close()
        shm.unlink()


def test_noncontiguous_buffer_rejected() -> None:
    arr = np.frombuffer(PAGE_JPEG * 2, dtype=np.uint8)[::2]
    with pytest.raises((BufferError, TypeError, ValueError)):
        jpeg_size(arr)


# --------------------------------------------------------------------------- errors


BAD_INPUTS = [
    pytest.param(b"", id="empty"),
    pytest.param(bytearray(), id="empty-bytearray"),
    pytest.param(bytes(np.random.default_rng(7).integers(0, 256, 5000, dtype=np.uint8)), id="random"),
    pytest.param(b"\xff\xd8", id="soi-only"),
    pytest.param(b"\xff\xd8\xff\xd9", id="soi-eoi"),
    pytest.param(PAGE_JPEG[:200], id="header-cut"),
    pytest.param(tables_only(PAGE_JPEG), id="tables-only"),
]


@pytest.mark.parametrize("bad", BAD_INPUTS)
def test_bad_input_raises(bad: bytes) -> None:
    with pytest.raises(ImgCodecError):
        jpeg_size(bad)
    with pytest.raises(ImgCodecError):
        decode(bad)
    with pytest.raises(ImgCodecError):
        frame_diff(bad, PAGE_JPEG)
    with pytest.raises(ImgCodecError):
        frame_diff(PAGE_JPEG, bad)


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_truncated_jpeg_raises(scale: int) -> None:
    half = PAGE_JPEG[: len(PAGE_JPEG) // 2]
    assert jpeg_size(half) == (1280, 768)  # the header is intact
    with pytest.raises(ImgCodecError, match="Premature end of JPEG file"):
        decode(half, scale=scale)
    with pytest.raises(ImgCodecError, match="image b: "):
        frame_diff(PAGE_JPEG, half, scale=scale)
    with pytest.raises(ImgCodecError, match="image a: "):
        frame_diff(half, PAGE_JPEG, scale=scale)


def test_error_is_value_error_with_tj_message() -> None:
    assert issubclass(ImgCodecError, ValueError)
    assert ImgCodecError.__module__ == "engine._imgcodec"
    with pytest.raises(ValueError, match="Not a JPEG file"):
        decode(b"GIF89a" + b"\0" * 100)


def test_too_large_header_rejected_before_allocating() -> None:
    huge = patch_sof_size(SMALL_JPEG, 40000, 40000)
    assert jpeg_size(huge) == (40000, 40000)
    with pytest.raises(ImgCodecError, match="too large"):
        decode(huge)
    with pytest.raises(ImgCodecError, match="too large"):
        frame_diff(huge, with_comment(huge))
    # within the limit but the data does not match the header: a clean error, not garbage
    with pytest.raises(ImgCodecError):
        decode(patch_sof_size(SMALL_JPEG, 640, 480))


@pytest.mark.parametrize("scale", [0, 3, 5, 16, -1, 100])
def test_bad_scale(scale: int) -> None:
    with pytest.raises(ValueError, match="scale"):
        decode(SMALL_JPEG, scale=scale)
    with pytest.raises(ValueError, match="scale"):
        frame_diff(SMALL_JPEG, SMALL_JPEG, scale=scale)


def test_bad_threshold() -> None:
    for threshold in (-1, 256):
        with pytest.raises(ValueError, match="threshold"):
            frame_diff(SMALL_JPEG, SMALL_JPEG, threshold=threshold)


def test_encode_bad_arguments() -> None:
    with pytest.raises(ValueError, match="quality"):
        encode(SMALL, quality=0)
    with pytest.raises(ValueError, match="quality"):
        encode(SMALL, quality=101)
    with pytest.raises(ValueError, match="subsampling"):
        encode(SMALL, subsampling="4:2:0")
    for bad in (SMALL[..., :2], SMALL.astype(np.float32), SMALL[0], np.zeros((0, 4, 3), np.uint8)):
        with pytest.raises(ValueError):
            encode(bad)


def test_encode_wrong_buffer_size() -> None:
    from engine._imgcodec import _core

    with pytest.raises(ImgCodecError, match="expected"):
        _core.encode(SMALL.tobytes()[:-1], 64, 48)
    with pytest.raises(ImgCodecError, match="expected"):
        _core.encode(SMALL.tobytes(), 65, 48)
    with pytest.raises(ImgCodecError, match="expected"):
        _core.encode(b"", 1, 1)
    with pytest.raises(ValueError):
        _core.encode(b"", 0, 0)
    with pytest.raises(ValueError):
        _core.encode(SMALL.tobytes(), 2**31 - 1, 2**31 - 1)
    with pytest.raises(TypeError):
        _core.encode("not bytes", 1, 1)


# --------------------------------------------------------------------------- fuzzing

BASES = [SMALL_JPEG, SMALL_PIL_PROGRESSIVE, encode(smooth_image(24, 40), subsampling="422")]


@st.composite
def mutated_jpeg(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.sampled_from(["set", "flip", "insert", "delete", "ff"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if not data:
            break
        if op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 64))]
        else:
            data[pos] = 0xFF  # spurious markers
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated_jpeg(), scale=st.sampled_from([1, 2, 4, 8]))
def test_fuzz_mutations_only_raise_imgcodecerror(data: bytes, scale: int) -> None:
    size = None
    try:
        size = jpeg_size(data)
        assert size[0] > 0 and size[1] > 0
    except ImgCodecError:
        pass
    try:
        out = decode(data, scale=scale)
        assert size is not None
        assert out.shape == (math.ceil(size[1] / scale), math.ceil(size[0] / scale), 3)
    except ImgCodecError:
        pass
    for a, b in ((data, SMALL_JPEG), (SMALL_JPEG, data), (data, with_comment(data))):
        try:
            frac, mean = frame_diff(a, b, scale=scale)
            assert 0.0 <= frac <= 1.0 and 0.0 <= mean <= 255.0
        except ImgCodecError:
            pass


# --------------------------------------------------------------------------- threads


def test_decode_from_four_threads() -> None:
    jpegs = [PAGE_JPEG, encode(page_image(seed=11), quality=70), SMALL_PIL_PROGRESSIVE]
    expected = {(i, s): decode(j, scale=s) for i, j in enumerate(jpegs) for s in (1, 2, 4, 8)}
    expected_diff = frame_diff(jpegs[0], jpegs[1])
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        try:
            barrier.wait()
            for k in range(12):
                i, s = (tid + k) % len(jpegs), (1, 2, 4, 8)[k % 4]
                np.testing.assert_array_equal(decode(jpegs[i], scale=s), expected[(i, s)])
                assert frame_diff(jpegs[0], jpegs[1]) == expected_diff
                with pytest.raises(ImgCodecError):
                    decode(jpegs[i][: len(jpegs[i]) // 2])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --------------------------------------------------------------------------- caller buffers (out=)


def _needed_size(rgb: np.ndarray, subsampling: str = "420") -> int:
    """The size encode(out=...) asks for, read from its ValueError on a 1-byte buffer."""
    with pytest.raises(ValueError, match=r"need at least \d+") as exc:
        encode(rgb, subsampling=subsampling, out=bytearray(1))
    return int(re.search(r"need at least (\d+)", str(exc.value)).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("scale", ic.SCALES)
@pytest.mark.parametrize("fast", [False, True])
def test_decode_into_out_equals_decode(scale: int, fast: bool) -> None:
    for jpeg in (PAGE_JPEG, SMALL_JPEG, SMALL_PIL_PROGRESSIVE):
        ref = decode(jpeg, scale, fast=fast)
        out = np.full(ref.shape, 7, np.uint8)
        got = decode(jpeg, scale, fast=fast, out=out)
        assert got is out
        np.testing.assert_array_equal(out, ref)


def test_decode_into_out_odd_sizes_and_buffers() -> None:
    img = smooth_image(37, 53)
    jpeg = encode(img, quality=90)
    for scale in ic.SCALES:
        shape = (math.ceil(37 / scale), math.ceil(53 / scale), 3)
        out = np.empty(shape, np.uint8)
        np.testing.assert_array_equal(decode(memoryview(bytearray(jpeg)), scale, out=out), decode(jpeg, scale))
    # a view into a bigger array that is still C-contiguous (whole leading rows) is fine
    big = np.zeros((100, 53, 3), np.uint8)
    decode(jpeg, out=big[10:47])
    np.testing.assert_array_equal(big[10:47], decode(jpeg))
    assert not big[:10].any() and not big[47:].any()


@pytest.mark.parametrize(
    "out",
    [
        np.empty((768, 1280, 3), np.uint16),  # wrong dtype
        np.empty((768, 1280, 3), np.int8),  # wrong dtype, same itemsize
        np.empty((767, 1280, 3), np.uint8),  # wrong height
        np.empty((768, 1281, 3), np.uint8),  # wrong width
        np.empty((1280, 768, 3), np.uint8),  # transposed: right byte count, wrong shape
        np.empty((768, 1280, 4), np.uint8),  # RGBA
        np.empty((768 * 1280 * 3,), np.uint8),  # flat, right byte count
        np.empty((768, 1280 * 3), np.uint8),  # 2-D, right byte count
        np.empty((768, 2560, 3), np.uint8)[:, ::2],  # not C-contiguous
        np.empty((1280, 768, 3), np.uint8).transpose(1, 0, 2),  # Fortran-ish
        bytearray(768 * 1280 * 3),  # not a numpy array
        memoryview(bytearray(768 * 1280 * 3)),
    ],
)
def test_decode_out_bad_rejected(out: object) -> None:
    with pytest.raises(ValueError, match="out"):
        decode(PAGE_JPEG, out=out)  # type: ignore[arg-type]


def test_decode_out_read_only_and_wrong_scale_rejected() -> None:
    ro = np.empty((768, 1280, 3), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writ"):
        decode(PAGE_JPEG, out=ro)
    ro_buf = np.frombuffer(bytes(768 * 1280 * 3), np.uint8).reshape(768, 1280, 3)
    with pytest.raises(ValueError, match="out"):
        decode(PAGE_JPEG, out=ro_buf)
    with pytest.raises(ValueError, match=r"expected \(384, 640, 3\)"):
        decode(PAGE_JPEG, scale=2, out=np.empty((768, 1280, 3), np.uint8))
    # the low-level check does not depend on the wrapper's checks
    with pytest.raises(ValueError, match="out"):
        ic._core.decode(PAGE_JPEG, out=np.empty((1280, 768, 3), np.uint8))
    with pytest.raises(ValueError, match="out"):
        ic._core.decode(PAGE_JPEG, out=ro)


def test_decode_out_corrupt_input_raises_imgcodecerror() -> None:
    out = np.empty((48, 64, 3), np.uint8)
    with pytest.raises(ImgCodecError):
        decode(SMALL_JPEG[: len(SMALL_JPEG) // 2], out=out)
    with pytest.raises(ImgCodecError):
        decode(b"", out=out)


def test_decode_out_overlapping_input_rejected() -> None:
    jpeg = SMALL_JPEG
    backing = np.zeros(48 * 64 * 3 + len(jpeg), np.uint8)
    backing[: len(jpeg)] = np.frombuffer(jpeg, np.uint8)
    out = backing[: 48 * 64 * 3].reshape(48, 64, 3)
    with pytest.raises(ValueError, match="overlap"):
        decode(backing[: len(jpeg)], out=out)


@pytest.mark.parametrize("subsampling", ic.SUBSAMPLINGS)
@pytest.mark.parametrize("fast", [False, True])
def test_encode_into_bytearray_matches_bytes(subsampling: str, fast: bool) -> None:
    for img in (PAGE, SMALL, smooth_image(37, 53)):
        ref = encode(img, 85, subsampling, fast=fast)
        buf = bytearray(b"\xaa") * _needed_size(img, subsampling)
        n = encode(img, 85, subsampling, fast=fast, out=buf)
        assert type(n) is int and n == len(ref)
        assert bytes(buf[:n]) == ref
        assert set(buf[n:]) <= {0xAA}  # nothing written past the JPEG


def test_encode_into_numpy_and_shared_memory() -> None:
    ref = encode(PAGE, 80)
    need = _needed_size(PAGE)
    assert need >= len(ref)
    arr = np.zeros(need + 10, np.uint8)
    n = encode(PAGE, 80, out=arr)
    assert arr[:n].tobytes() == ref

    shm = shared_memory.SharedMemory(create=True, size=need + 4096)
    try:
        view = shm.buf[100 : 100 + need]
        try:
            n = encode(PAGE, 80, out=view)
            assert n == len(ref)
            assert bytes(view[:n]) == ref
            # and the JPEG decodes straight from shared memory into a caller array
            got = decode(view[:n], out=np.empty((768, 1280, 3), np.uint8))
            np.testing.assert_array_equal(got, decode(ref))
        finally:
            view.release()
    finally:
        shm.close()
        shm.unlink()


def test_encode_out_too_small_names_size() -> None:
    need = _needed_size(SMALL)
    ref = encode(SMALL)
    assert need >= len(ref)  # even though the real JPEG would fit, the worst case must
    for size in (0, len(ref), need - 1):
        buf = bytearray(size)
        with pytest.raises(ValueError, match=rf"need at least {need}\b"):
            encode(SMALL, out=buf)
        assert buf == bytearray(size)
    assert encode(SMALL, out=bytearray(need)) == len(ref)


def test_encode_out_bad_buffers_rejected() -> None:
    need = _needed_size(SMALL)
    with pytest.raises(ValueError, match="writable"):
        encode(SMALL, out=bytes(need))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="writable"):
        encode(SMALL, out=memoryview(bytes(need)))
    ro = np.zeros(need, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        encode(SMALL, out=ro)
    with pytest.raises(ValueError, match="writable"):
        encode(SMALL, out=np.zeros(2 * need, np.uint8)[::2])  # not contiguous
    with pytest.raises(ValueError, match="writable"):
        encode(SMALL, out=12345)  # type: ignore[arg-type]
    # still validates the other arguments first
    with pytest.raises(ValueError, match="quality"):
        encode(SMALL, quality=0, out=bytearray(need))
    # output overlapping the input pixels
    backing = np.zeros(SMALL.nbytes + need, np.uint8)
    img = backing[: SMALL.nbytes].reshape(SMALL.shape)
    img[:] = SMALL
    with pytest.raises(ValueError, match="overlap"):
        encode(img, out=backing)


def test_out_variants_from_four_threads() -> None:
    jpegs = [encode(page_image(seed=s)) for s in range(4)]
    refs = [decode(j, 2) for j in jpegs]
    need = _needed_size(PAGE)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            out = np.empty_like(refs[i])
            buf = bytearray(need)
            for _ in range(10):
                decode(jpegs[i], 2, out=out)
                np.testing.assert_array_equal(out, refs[i])
                n = encode(PAGE, out=buf)
                assert bytes(buf[:n]) == PAGE_JPEG
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
