"""The ``hf`` backend's dynamic batching: requests/s and tokens/s against the number of concurrent requests.

    python -m bench.policy [--device cuda] [--hidden-size 1024] [--layers 8] [--concurrency 1 4 16 32]

A random-weight Qwen-VL model of the given size is built offline (``policy.tiny_models``); each request
is an agent chat with one 1280x768 screenshot and asks for at most ``--tokens`` tokens, greedily (a
random model may stop early, so the tokens actually generated are counted). For each concurrency C, C
rollouts send requests back to back for ``--seconds``; the backend batches whatever is queued (up to C)
into one ``generate`` call. Printed: requests/s, generated tokens/s, mean
batch size, and the speed-up over C=1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine import _imgcodec as codec
from engine.model_api import ChatRequest, SamplingParams
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


async def measure(model: HFModel, concurrency: int, seconds: float, tokens: int, jpeg: bytes) -> dict[str, Any]:
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens)
    messages = [{"role": "system", "content": "You are a web agent."},
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


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = build_tiny_model(Path(tmp) / "model", args.arch, hidden_size=args.hidden_size, num_layers=args.layers,
                                max_pixels=args.max_pixels)
        model = HFModel(path, device=args.device, max_batch=max(args.concurrency))
        await model.start()
        print(f"model: {args.arch}, hidden {args.hidden_size}, {args.layers} layers, on {model.device} "
              f"as {model.dtype} (built and loaded in {time.perf_counter() - t:.1f} s)")
        jpeg = screenshot(0)
        await measure(model, 2, 1.0, args.tokens, jpeg)  # warm-up (kernels, allocator)
        rows = [await measure(model, c, args.seconds, args.tokens, jpeg) for c in args.concurrency]
        await model.close()
    base = rows[0]["requests_per_s"]
    print(f"{'concurrency':>11} {'req/s':>8} {'tok/s':>9} {'batch':>6} {'speed-up':>8}")
    for r in rows:
        r["speedup"] = r["requests_per_s"] / base
        print(f"{r['concurrency']:>11} {r['requests_per_s']:>8.2f} {r['tokens_per_s']:>9.1f} "
              f"{r['mean_batch']:>6.1f} {r['speedup']:>7.2f}x")
    return rows


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
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
