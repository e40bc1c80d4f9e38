"""End-to-end throughput of the RL loop, synchronous vs asynchronous, in one run on the same tasks.

Both modes run ``webgym-engine train``'s loop (:func:`train.loop.run_loop`, GRPO) for ``--iterations`` iterations
over the bundled coin-flip tasks (a reward with variance, whatever the model does). The policy is a tiny Qwen3-VL
on the CPU (real generation, token ids and log-probs, real GRPO updates and in-place weight swaps) whose replies
are held back to the time a served 7-8B VLM would take (:class:`PacedModel`: :mod:`policy.simulated`'s latency
model, a benchmark stand-in named as such), so rollouts take the time they take against a real server while the
trainer's share is the tiny model's training on this machine's CPU.

Reported per mode: samples built per second (from the first rollout to the last push), iterations per minute
(each iteration trains ``--train-steps`` optimizer steps; the ratio between the modes is taken over these),
the browser slots' occupancy and the policy's idle fraction (over the run and while the trainer trained and
pushed), and the mean rollout wait and training time per iteration. The async/sync ratio is printed beside its
bound: with rollout time R and training (plus push) time T per iteration, the synchronous loop takes R + T and a
perfectly overlapped one max(R, T), so the ratio cannot exceed (R + T) / max(R, T) (2x at R = T). On a machine
where the trainer shares the CPU with the browsers (2 cores here), overlapping also slows both down. AsyncWebRL's
2.4-2.9x over WebGym's synchronous loop also comes from removing the synchronous batch's wait for its longest
episode, which a batch of equal, short coin-flip episodes barely has.

    python -m bench.rl_loop [--iterations 4] [--train-steps 4] [--concurrency 16] [--staleness 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.agent.model_api import ChatRequest, Generation, image_refs
from policy.hf_backend import HFModel
from policy.simulated import LatencyModel
from policy.tiny_models import build_tiny_model
from policy.weight_sync import InProcessSync
from train.config import TrainConfig
from train.loop import IterationReport, run_loop
from train.loop_config import LoopConfig, LoopMode
from train.policy_target import PolicyTarget
from train.utilization import CountingModel

# A coin flip evaluated on the final page (Math.random() < 0.5): reward variance within every group.
COIN_TASKS = [
    {"task_id": f"coin-{site}", "task_name": f"Look around the {site} site.", "website": f"{{SITES}}/{site}/",
     "difficulty": 1, "evaluator_reference": [{"id": 1, "description": "luck", "facts": ["a coin flip"],
                                               "checks": [{"kind": "js", "expr": "Math.random() < 0.5"}]}]}
    for site in ("wiki", "shop", "forum", "travel")
]


class PacedModel(CountingModel):
    """A benchmark stand-in: ``model``'s replies, each held back to a served VLM's latency (prefill, images and a
    log-normal number of decoded tokens, slower as more requests decode at once: :class:`LatencyModel`)."""

    def __init__(self, model: HFModel, latency: LatencyModel, seed: int = 0) -> None:
        super().__init__(model)
        self.latency = latency
        self._rng = random.Random(seed)

    def seconds(self, request: ChatRequest) -> float:
        lm = self.latency
        tokens = min(request.sampling.max_tokens * 10, math.exp(math.log(lm.median_tokens) + lm.sigma
                                                                 * self._rng.gauss(0.0, 1.0)))
        ms = lm.prefill_ms + lm.image_ms * len(image_refs(request.messages))
        ms += tokens * lm.token_ms * (1 + self.in_flight / lm.knee)
        return ms / 1000.0 / lm.speed

    async def generate(self, request: ChatRequest) -> Generation:
        pace = asyncio.ensure_future(asyncio.sleep(self.seconds(request)))
        gen = await super().generate(request)
        await pace
        return gen


def config(root: Path, model: Path, mode: LoopMode, args: argparse.Namespace) -> LoopConfig:
    tasks = root / "coin.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in COIN_TASKS) + "\n")
    train = TrainConfig.from_dict({
        "model_dir": str(model), "algorithm": "grpo", "lr": 1e-4, "max_steps": args.train_steps, "batch_size": 8,
        "cpu_threads": 1, "progress": False, "tensorboard": False, "plots": False,
        "agent": {"response_format": "vanilla", "window": 1}}, "bench")
    return LoopConfig(train=train, tasks=str(tasks), iterations=args.iterations, mode=mode, staleness=args.staleness,
                      samples_per_task=4, concurrency=args.concurrency, device="cpu", temperature=0.7, top_p=0.9,
                      max_tokens=16, step_caps=(args.steps, args.steps, args.steps),
                      output_dir=str(root / f"rl-{mode}"))


def summarise(mode: str, reports: list[IterationReport], wall_s: float) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        values = [getattr(r, key) for r in reports if getattr(r, key) is not None]
        return round(statistics.fmean(values), 3) if values else None

    samples = sum(r.samples for r in reports)
    push_s = [r.push["held_s"] for r in reports if r.push]
    return {"mode": mode, "iterations": len(reports), "samples": samples, "wall_s": round(wall_s, 2),
            "samples_per_s": round(samples / wall_s, 3), "iterations_per_min": round(60 * len(reports) / wall_s, 2),
            "rollout_wait_s": mean("wait_s"), "train_s": mean("train_s"),
            "push_held_s": round(statistics.fmean(push_s), 3) if push_s else None,
            "browser_busy": mean("browser_busy"), "browser_busy_training": mean("browser_busy_training"),
            "policy_idle": mean("policy_idle"), "policy_idle_training": mean("policy_idle_training"),
            "max_staleness": max(r.max_staleness for r in reports), "versions": [r.versions_seen for r in reports]}


async def run_mode(root: Path, model: Path, mode: LoopMode, args: argparse.Namespace) -> dict[str, Any]:
    hf = HFModel(str(model), device="cpu", max_batch=args.concurrency)
    target = PolicyTarget(PacedModel(hf, LatencyModel(speed=args.speed)), InProcessSync(hf))
    t0 = time.monotonic()
    reports = (await run_loop(config(root, model, mode, args), target)).iterations
    # The loop's last push ends its last iteration; the drain of the pool afterwards is not training work.
    wall = sum(r.wait_s + r.train_s + (r.push["held_s"] if r.push else 0.0) for r in reports)
    return {**summarise(mode, reports, wall), "total_s": round(time.monotonic() - t0, 2)}


def loop_arguments(description: str, *, iterations: int, train_steps: int, concurrency: int,
                   staleness: int) -> argparse.ArgumentParser:
    """The command line of a loop benchmark over the coin-flip tasks (what :func:`config` reads), its defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--train-steps", type=int, default=train_steps, help="optimizer steps per iteration")
    parser.add_argument("--concurrency", type=int, default=concurrency)
    parser.add_argument("--steps", type=int, default=3, help="step cap of every episode")
    parser.add_argument("--staleness", type=int, default=staleness, help="async: versions the rollouts may run ahead")
    parser.add_argument("--json", type=Path, default=None)
    return parser


def main() -> None:
    parser = loop_arguments(__doc__.split("\n\n")[0], iterations=4, train_steps=4, concurrency=16, staleness=2)
    parser.add_argument("--speed", type=float, default=1.0, help="divides the simulated server's latency")
    args = parser.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model", "qwen3_vl", hidden_size=64, num_layers=2)
        results = {mode: uvloop.run(run_mode(root, model, mode, args)) for mode in ("sync", "async")}
    sync, asyn = results["sync"], results["async"]
    r, t = sync["rollout_wait_s"] or 0.0, (sync["train_s"] or 0.0) + (sync["push_held_s"] or 0.0)
    bound = (r + t) / max(r, t) if max(r, t) > 0 else None
    # Every iteration trains the same optimizer steps; the samples built per iteration vary with the coin flips
    # (groups without reward variance give none), so the ratio is taken over iterations per minute.
    out = {"config": vars(args) | {"json": None}, "latency_model": LatencyModel().__dict__, **results,
           "ratio_async_sync": round(asyn["iterations_per_min"] / sync["iterations_per_min"], 2),
           "ratio_samples_per_s": round(asyn["samples_per_s"] / sync["samples_per_s"], 2),
           "ratio_bound": round(bound, 2) if bound else None}
    for mode in ("sync", "async"):
        m = results[mode]
        print(f"{mode:5}: {m['samples_per_s']:.2f} samples/s, {m['iterations_per_min']:.1f} iterations/min; "
              f"per iteration rollout wait {m['rollout_wait_s']:.1f} s, train {m['train_s']:.1f} s; browsers busy "
              f"{m['browser_busy']:.0%} ({m['browser_busy_training']:.0%} while training); policy idle "
              f"{m['policy_idle']:.0%} ({m['policy_idle_training']:.0%} while training)")
    print(f"async / sync: {out['ratio_async_sync']}x in iterations per minute ({out['ratio_samples_per_s']}x in "
          f"samples per second); bound (R + T) / max(R, T) = {out['ratio_bound']}x with R = {r:.1f} s of rollout and "
          f"T = {t:.1f} s of training and push per synchronous iteration")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
