"""The ``policy`` suite: Only where CUDA is available: ``bench/policy.py``, the ``hf`` backend's dynamic batching on a
random-weight Qwen2.5-VL architecture with a full-size language model (hidden 3584, 28 layers) and the released
models' vision tower (built offline), one
1280x768 screenshot per request: requests/s and generated tokens/s against the number of concurrent requests.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.suite import Figure, SuiteResult, plot_series

CONFIG: dict[str, dict[str, Any]] = {  # per scale (the CLI's --repeats overrides "repeats")
    "full": {"concurrency": [1, 4, 16, 32, 64], "hidden_size": 3584, "layers": 28, "seconds": 20.0, "tokens": 64,
             "repeats": 3},
    "quick": {"concurrency": [1, 16, 64], "hidden_size": 3584, "layers": 28, "seconds": 8.0, "tokens": 64,
              "repeats": 1},
    "tiny": {"concurrency": [1, 2], "hidden_size": 256, "layers": 2, "seconds": 1.0, "tokens": 8, "repeats": 1},
}


def budget_s(cfg: dict[str, Any]) -> float:
    """What a run of ``cfg`` takes where a GPU runs it (nothing elsewhere: the suite is skipped): the model built
    once per repeat (allowed a minute; not timed: no GPU where the budgets were priced), then a window per
    concurrency level."""
    if gpu_unavailable_reason() is not None:
        return 0.0
    return cfg["repeats"] * (60.0 + len(cfg["concurrency"]) * (cfg["seconds"] + 5.0))


def gpu_unavailable_reason() -> str | None:
    """Why the policy suite cannot run here (None when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


async def measure(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """``bench/policy.py``: the hf backend's requests/s and tokens/s against concurrent requests (GPU only)."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        res.skipped = reason
        return
    from bench import policy as policy_bench  # torch and the model code: only where the suite runs


    for rep in range(cfg["repeats"]):
        args = argparse.Namespace(arch="qwen2_5_vl", device="cuda", hidden_size=cfg["hidden_size"],
                                  layers=cfg["layers"], max_pixels=1280 * 28 * 28, tokens=cfg["tokens"],
                                  seconds=cfg["seconds"], concurrency=cfg["concurrency"],
                                  vision="full", vision_attention="varlen")
        rows = await policy_bench.main_async(args)
        for r in rows:
            c = r["concurrency"]
            res.add(f"c{c}.requests_per_s", f"c{c}: requests/s", r["requests_per_s"], "req/s")
            res.add(f"c{c}.tokens_per_s", f"c{c}: generated tokens/s", r["tokens_per_s"], "tok/s")
            res.add(f"c{c}.mean_batch", f"c{c}: mean batch", r["mean_batch"])
            res.add(f"c{c}.speedup", f"c{c}: requests/s vs 1 request", r["speedup"], "x")
        res.runs.append({"repeat": rep, "rows": rows})
    levels = cfg["concurrency"]
    plot_series(out / "policy.png", "hf backend: dynamic batching", "concurrent requests", "per second",
                {"requests/s": (levels, [res.figures.get(f"c{c}.requests_per_s") for c in levels]),
                 "tokens/s / 10": (levels, [_scaled(res.figures.get(f"c{c}.tokens_per_s"), 0.1) for c in levels])})
    res.plots.append("policy.png")


def _scaled(fig: Figure | None, k: float) -> Figure | None:
    return None if fig is None else Figure(fig.key, fig.label, fig.unit, None, [v * k for v in fig.values])
