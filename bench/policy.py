"""The ``hf`` backend's dynamic batching: requests/s and tokens/s against the number of concurrent requests.

    python -m bench.policy [--device cuda] [--hidden-size 1024] [--layers 8] [--concurrency 1 4 16 32]
        [--vision-attention varlen|default|both] [--json docs/benchmarks/policy_batching.json]

A random-weight Qwen-VL model of the given size is built offline (``policy.tiny_models``), with the vision tower
of the released Qwen2.5-VL models (32 blocks 1280 wide, windowed; ``--vision tiny`` keeps the tests' 2-block
tower) for ``qwen2_5_vl``; each request
is an agent chat with one 1280x768 screenshot and asks for at most ``--tokens`` tokens, greedily (a
random model may stop early, so the tokens actually generated are counted). For each concurrency C, C
rollouts send requests back to back for ``--seconds``; the backend batches whatever is queued (up to C)
into one ``generate`` call. Printed: requests/s, generated tokens/s, mean
batch size, and the speed-up over C=1. ``--vision-attention both`` measures the vision tower's attention as
transformers runs it (``default``, one call per window) and as the backend runs it (``varlen``, one call per
block), one after the other on the same model files, and prints the ratio; ``--json`` stores the rows
(``bench.report`` convention).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine import _imgcodec as codec
from engine.agent.model_api import ChatRequest, SamplingParams
from policy.hf_backend import HFModel
from policy.tiny_models import build_tiny_model


def screenshot(seed: int) -> bytes:
    """A 1280x768 page-like JPEG."""
    rng = np.random.default_rng(seed)
    img = np.full((768, 1280, 3), 245, np.uint8)
    img[:80] = (40, 40, 60)
    for y in range(120, 760, 24):
        img[y:y + 10, 60:60 + int(rng.integers(200, 1100))] = rng.integers(0, 120, 3)
    return codec.encode(img, quality=80)


#: The vision tower of the released Qwen2.5-VL 3B and 7B models (their config.json's vision_config).
QWEN25_VL_TOWER: dict[str, Any] = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                                   "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}


async def measure(model: HFModel, concurrency: int, seconds: float, tokens: int, jpeg: bytes) -> dict[str, Any]:
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a web agent."},
                {"role": "user", "content": [{"type": "text", "text": "Task: find the cheapest mug."},
                                             {"type": "image", "image": "shot.jpg"}]}]
    done = {"requests": 0, "tokens": 0}
    batches_before, batched_before = model.batches_run, model.requests_batched
    stop = time.perf_counter() + seconds

    async def rollout(i: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            gen = await model.generate(ChatRequest(f"{i}/{n}", messages, {"shot.jpg": jpeg}, sampling))
            done["requests"] += 1
            done["tokens"] += len(gen.token_ids or [])
            n += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(rollout(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - t0
    batches = model.batches_run - batches_before
    return {"concurrency": concurrency, "requests_per_s": done["requests"] / elapsed,
            "tokens_per_s": done["tokens"] / elapsed,
            "mean_batch": (model.requests_batched - batched_before) / max(batches, 1), "seconds": elapsed}


async def measure_levels(path: Path, args: argparse.Namespace, vision_attention: str) -> list[dict[str, Any]]:
    """Every concurrency level on the model at ``path``, loaded with ``vision_attention``."""
    t = time.perf_counter()
    model = HFModel(path, device=args.device, max_batch=max(args.concurrency), vision_attention=vision_attention)
    await model.start()
    print(f"model: {args.arch}, hidden {args.hidden_size}, {args.layers} layers, on {model.device} as {model.dtype}, "
          f"vision attention {vision_attention} (loaded in {time.perf_counter() - t:.1f} s)")
    jpeg = screenshot(0)
    try:
        await measure(model, 2, 1.0, args.tokens, jpeg)  # warm-up (kernels, allocator)
        rows = [await measure(model, c, args.seconds, args.tokens, jpeg) for c in args.concurrency]
    finally:
        await model.close()
    base = rows[0]["requests_per_s"]
    print(f"{'concurrency':>11} {'req/s':>8} {'tok/s':>9} {'batch':>6} {'speed-up':>8}")
    for r in rows:
        r["vision_attention"] = vision_attention
        r["speedup"] = r["requests_per_s"] / base
        print(f"{r['concurrency']:>11} {r['requests_per_s']:>8.2f} {r['tokens_per_s']:>9.1f} "
              f"{r['mean_batch']:>6.1f} {r['speedup']:>7.2f}x")
    return rows


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Build the model once, then measure it with each vision attention asked for; all rows."""
    modes = ["default", "varlen"] if args.vision_attention == "both" else [args.vision_attention]
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        tower = QWEN25_VL_TOWER if args.vision == "full" and args.arch == "qwen2_5_vl" else None
        path = build_tiny_model(Path(tmp) / "model", args.arch, hidden_size=args.hidden_size, num_layers=args.layers,
                                max_pixels=args.max_pixels, vision=tower)
        print(f"model files written in {time.perf_counter() - t:.1f} s")
        rows = [r for mode in modes for r in await measure_levels(path, args, mode)]
    for r in summary_rows(rows):
        if r["unit"] == "x":
            print(f"{r['figure']}: {r['value']:.2f}x")
    return rows


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests/s per vision attention and concurrency, and varlen / default where both were measured."""
    from bench.report import row

    out = [row(f"{r['vision_attention']} vision attention, {r['concurrency']} concurrent: requests/s",
               r["requests_per_s"], "req/s") for r in rows]
    for r in rows:
        before = next((b for b in rows if b["concurrency"] == r["concurrency"] and b["vision_attention"] == "default"
                       and r["vision_attention"] == "varlen"), None)
        if before and before["requests_per_s"] > 0:
            out.append(row(f"{r['concurrency']} concurrent: varlen / default requests/s",
                           r["requests_per_s"] / before["requests_per_s"], "x"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2_5_vl", choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-pixels", type=int, default=1280 * 28 * 28, help="image processor bound")
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens per request")
    parser.add_argument("--seconds", type=float, default=5.0, help="per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--vision", choices=("full", "tiny"), default="full",
                        help="qwen2_5_vl's vision tower: the released models' (full) or the tests' 2 blocks (tiny)")
    parser.add_argument("--vision-attention", choices=("varlen", "default", "both"), default="varlen",
                        help="the vision tower's attention (both: default, then varlen, on the same model files)")
    parser.add_argument("--json", type=Path, default=None, help="store the rows here (bench.report convention)")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        from bench.report import write_result

        write_result(args.json, "policy_batching", vars(args) | {"json": None}, summary_rows(rows), [], [], rows=rows)


if __name__ == "__main__":
    main()
