"""Image-codec micro-benchmark: engine._imgcodec vs PyTurboJPEG vs Pillow on real screenshots.

    python -m bench.codec [--json PATH] [--reps N]

Screenshots (1280x768 JPEG, quality 80) are taken with headless Chromium (the browser pool's own
flags) from the bundled sites. For each operation the median over ``--reps`` single calls is
reported (cycling through the screenshots), with the speed-up of _imgcodec over the others.

Operations:
  decode          full-size JPEG -> RGB array
  decode_1/2      DCT-scaled decode at 1/2 (Pillow: ``draft``)
  decode_1/4      DCT-scaled decode at 1/4
  resize_smart    RGB 1280x768 -> the Qwen2-VL smart_resize grid (1288x756; area down / bilinear up;
                  Pillow: BILINEAR with its antialiasing support; PyTurboJPEG has no resize)
  decode_resize   full-size decode, then resize to the smart_resize grid (Pillow: Image.open +
                  resize with BILINEAR, as in resize_smart)
  som_pipeline    decode + 40 Set-of-Marks boxes + encode (q80, 4:2:0); PyTurboJPEG uses
                  _imgcodec.draw_som for the drawing, Pillow ImageDraw + an alpha-composited overlay
  som_fast        the same with the fast paths: decode fast=True (TJFLAG_FASTDCT|FASTUPSAMPLE) and
                  encode fast=True (TJFLAG_FASTDCT); PyTurboJPEG with the same flags; Pillow has no
                  such switches and runs its plain pipeline
  frame_diff      two frames at 1/4, fast IDCT, changed fraction + mean abs diff (others: numpy)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from engine import _imgcodec as ic

PAGES = ["/shop/", "/shop/product.html?id=p01", "/wiki/", "/travel/", "/forum/", "/shop/search.html?q=mug"]
QUALITY = 80
WIDTH, HEIGHT = 1280, 768


async def _capture(base: str, quality: int, pages: list[str]) -> list[bytes]:
    from playwright.async_api import async_playwright

    from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM

    shots: list[bytes] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=CHROMIUM_FLAGS)
        ctx = await browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
        page = await ctx.new_page()
        for path in pages:
            await page.goto(base + path)
            await page.wait_for_timeout(300)  # script-rendered pages (the heavy profile) draw after load
            shots.append(await page.screenshot(type="jpeg", quality=quality))
        await browser.close()
    return shots


def capture_screenshots(quality: int = QUALITY, pages: list[str] | None = None) -> list[bytes]:
    """Take one 1280x768 JPEG screenshot of each page (default :data:`PAGES`) from the bundled sites."""
    from engine.sites.server import SiteServer

    with SiteServer() as server:
        return asyncio.run(_capture(server.base_url, quality, pages or PAGES))


def make_boxes(n: int = 40, seed: int = 0) -> list[tuple[int, int, int, int, int]]:
    """``n`` random ``(id, x0, y0, x1, y1)`` element boxes over a 1280x768 page."""
    rng = np.random.default_rng(seed)
    boxes = []
    for i in range(n):
        w, h = int(rng.integers(40, 300)), int(rng.integers(16, 80))
        x0, y0 = int(rng.integers(0, WIDTH - w)), int(rng.integers(0, HEIGHT - h))
        boxes.append((i, x0, y0, x0 + w, y0 + h))
    return boxes


def median_ms(fn: Callable[[int], object], reps: int) -> float:
    """Median wall time in ms of ``fn(i)`` over ``reps`` calls (after 3 warm-up calls)."""
    for i in range(3):
        fn(i)
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _diff_np(a: np.ndarray, b: np.ndarray, threshold: int = 16) -> tuple[float, float]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float((d.max(axis=2) > threshold).mean()), float(d.mean())


def build_cases(shots: list[bytes]) -> dict[str, dict[str, Callable[[int], object]]]:
    """Per operation, per library: a callable taking the repetition index."""
    from PIL import Image, ImageDraw
    from turbojpeg import TJFLAG_FASTDCT, TJFLAG_FASTUPSAMPLE, TJPF_RGB, TJSAMP_420, TurboJPEG

    tj = TurboJPEG()
    n = len(shots)
    rgbs = [ic.decode(s) for s in shots]
    th, tw = ic.smart_resize(HEIGHT, WIDTH)
    boxes = make_boxes()
    fast = TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE

    def pil_decode(buf: bytes, scale: int = 1) -> np.ndarray:
        im = Image.open(io.BytesIO(buf))
        if scale != 1:
            im.draft("RGB", (im.width // scale, im.height // scale))
        return np.asarray(im if im.mode == "RGB" else im.convert("RGB"))

    def pil_som(i: int) -> bytes:
        im = Image.open(io.BytesIO(shots[i % n])).convert("RGB")
        overlay = Image.new("RGBA", im.size, (0, 0, 0, 0))
        od = ImageDraw.Draw(overlay)
        for bid, x0, y0, x1, y1 in boxes:
            od.rectangle((x0, y0, x1 - 1, y1 - 1), fill=(*ic.PALETTE[bid % len(ic.PALETTE)], 38))
        im = Image.alpha_composite(im.convert("RGBA"), overlay).convert("RGB")
        d = ImageDraw.Draw(im)
        for bid, x0, y0, x1, y1 in boxes:
            col = ic.PALETTE[bid % len(ic.PALETTE)]
            d.rectangle((x0, y0, x1 - 1, y1 - 1), outline=col, width=2)
            ly = max(0, y0 - 18)
            d.rectangle((x0, ly, x0 + 26, ly + 17), fill=col)
            d.text((x0 + 2, ly + 2), str(bid), fill=(255, 255, 255))
        out = io.BytesIO()
        im.save(out, format="JPEG", quality=QUALITY)
        return out.getvalue()

    def ic_som(i: int) -> bytes:
        rgb = ic.decode(shots[i % n])
        ic.draw_som(rgb, boxes)
        return ic.encode(rgb, QUALITY)

    def tj_som(i: int) -> bytes:
        rgb = tj.decode(shots[i % n], pixel_format=TJPF_RGB)
        ic.draw_som(rgb, boxes)
        return tj.encode(rgb, quality=QUALITY, pixel_format=TJPF_RGB, jpeg_subsample=TJSAMP_420)

    def ic_som_fast(i: int) -> bytes:
        rgb = ic.decode(shots[i % n], fast=True)
        ic.draw_som(rgb, boxes)
        return ic.encode(rgb, QUALITY, fast=True)

    def tj_som_fast(i: int) -> bytes:
        rgb = tj.decode(shots[i % n], pixel_format=TJPF_RGB, flags=fast)
        ic.draw_som(rgb, boxes)
        return tj.encode(rgb, quality=QUALITY, pixel_format=TJPF_RGB, jpeg_subsample=TJSAMP_420, flags=TJFLAG_FASTDCT)

    def pil_decode_resize(i: int) -> np.ndarray:
        im = Image.open(io.BytesIO(shots[i % n]))
        im = im if im.mode == "RGB" else im.convert("RGB")
        return np.asarray(im.resize((tw, th), Image.Resampling.BILINEAR))

    cases: dict[str, dict[str, Callable[[int], object]]] = {
        "decode": {
            "imgcodec": lambda i: ic.decode(shots[i % n]),
            "pyturbojpeg": lambda i: tj.decode(shots[i % n], pixel_format=TJPF_RGB),
            "pillow": lambda i: pil_decode(shots[i % n]),
        },
    }

    def scaled(s: int) -> dict[str, Callable[[int], object]]:
        """The decodes at 1/``s`` scale (``s`` bound here, not late in the loop below)."""
        return {
            "imgcodec": lambda i: ic.decode(shots[i % n], s),
            "pyturbojpeg": lambda i: tj.decode(shots[i % n], pixel_format=TJPF_RGB, scaling_factor=(1, s)),
            "pillow": lambda i: pil_decode(shots[i % n], s),
        }

    for s in (2, 4):
        cases[f"decode_1/{s}"] = scaled(s)
    cases["resize_smart"] = {
        "imgcodec": lambda i: ic.resize(rgbs[i % n], tw, th),
        "pillow": lambda i: np.asarray(Image.fromarray(rgbs[i % n]).resize((tw, th), Image.Resampling.BILINEAR)),
    }
    cases["decode_resize"] = {
        "imgcodec": lambda i: ic.resize(ic.decode(shots[i % n]), tw, th),
        "pillow": pil_decode_resize,
    }
    cases["som_pipeline"] = {"imgcodec": ic_som, "pyturbojpeg": tj_som, "pillow": pil_som}
    cases["som_fast"] = {"imgcodec": ic_som_fast, "pyturbojpeg": tj_som_fast, "pillow": pil_som}
    cases["frame_diff"] = {
        "imgcodec": lambda i: ic.frame_diff(shots[i % n], shots[(i + 1) % n]),
        "pyturbojpeg": lambda i: _diff_np(
            tj.decode(shots[i % n], pixel_format=TJPF_RGB, scaling_factor=(1, 4), flags=fast),
            tj.decode(shots[(i + 1) % n], pixel_format=TJPF_RGB, scaling_factor=(1, 4), flags=fast),
        ),
        "pillow": lambda i: _diff_np(pil_decode(shots[i % n], 4), pil_decode(shots[(i + 1) % n], 4)),
    }
    return cases


LIBS = ("imgcodec", "pyturbojpeg", "pillow")


def run(reps: int, pages: list[str] | None = None, shots: list[bytes] | None = None) -> dict[str, Any]:
    """Capture screenshots (or use ``shots``) and time every case; returns the results as a JSON-able dict."""
    shots = shots if shots is not None else capture_screenshots(pages=pages)
    sizes = [ic.jpeg_size(s) for s in shots]
    assert all(sz == (WIDTH, HEIGHT) for sz in sizes), sizes
    results: dict[str, dict[str, float]] = {}
    for op, libs in build_cases(shots).items():
        results[op] = {lib: round(median_ms(fn, reps), 3) for lib, fn in libs.items()}
    return {
        "reps": reps,
        "screenshots": len(shots),
        "jpeg_kib_mean": round(sum(map(len, shots)) / len(shots) / 1024, 1),
        "smart_resize": ic.smart_resize(HEIGHT, WIDTH),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "median_ms": results,
    }


def print_table(res: dict[str, Any]) -> None:
    """Print the medians and the speed-ups of _imgcodec over the other libraries."""
    print(
        f"{res['screenshots']} screenshots {WIDTH}x{HEIGHT}, mean {res['jpeg_kib_mean']} KiB; "
        f"median of {res['reps']} reps (ms)"
    )
    head = f"{'operation':<14}" + "".join(f"{lib:>13}" for lib in LIBS) + f"{'x vs tj':>10}{'x vs PIL':>10}"
    print(head)
    print("-" * len(head))
    for op, row in res["median_ms"].items():
        cells = "".join(f"{row[lib]:>13.3f}" if lib in row else f"{'n/a':>13}" for lib in LIBS)
        ours = row["imgcodec"]
        r_tj = f"{row['pyturbojpeg'] / ours:>10.2f}" if "pyturbojpeg" in row else f"{'n/a':>10}"
        r_pil = f"{row['pillow'] / ours:>10.2f}"
        print(f"{op:<14}{cells}{r_tj}{r_pil}")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results to this JSON file")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions per case (default 50)")
    args = ap.parse_args(argv)
    res = run(args.reps)
    print_table(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
