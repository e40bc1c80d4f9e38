"""Behaviour cloning end to end, on the CPU: a tiny random Qwen-VL model learns to solve bundled tasks.

1. the scripted policy solves a few short bundled tasks through the engine (real sites, real Chromium);
2. its runs become demonstrations (:mod:`train.demos`: the messages the agent protocol would have given a model,
   and a reply in the model's format, clicks on the 0..1000 grid);
3. the tiny model runs the same tasks through the engine (``hf`` backend, greedy): it solves none;
4. the trainer (:func:`train.trainer.train`, FBC) fits the demonstrations;
5. the trained checkpoint runs the tasks again through the ``hf`` backend, loaded from the directory the
   trainer wrote: the tasks it learnt are solved (reward 1).

To keep sequences short on a CPU: the ``vanilla`` reply format, no screenshot history (context window 0: earlier
steps are summary lines), a one-line system prompt (``--prompt-template``), small images (the tiny model's
processor). Run: ``python -m train.examples.bc_demo [--work DIR] [--steps N] [--tasks ID,...]`` (by default ten
tasks, :data:`FULL_TASKS`, 200 steps); prints the success rates before and after training and the time of each
phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Short tasks with short answers: two answers read off the start page, and a click followed by an answer
#: (the test's set).
TASKS: tuple[str, ...] = ("shop-001", "wiki-001", "shop-006")
#: The command line's default: ten tasks of the three sites, 16 steps: answers, clicks, a search typed.
FULL_TASKS: tuple[str, ...] = ("shop-001", "shop-002", "wiki-001", "travel-001", "shop-004", "shop-005", "shop-006",
                               "shop-007", "wiki-006", "wiki-003")

#: A one-line system prompt (the default one, with the tool's JSON schema, is ~1,500 characters).
SYSTEM_PROMPT = "You are a web agent. Reply with Action: and one <tool_call>.\n"


@dataclass
class DemoResult:
    """Figures of one demonstration run."""

    tasks: list[str]
    before: dict[str, float]  # task id -> reward of the untrained model
    after: dict[str, float]  # task id -> reward of the trained model
    times_s: dict[str, float]  # phase -> seconds
    samples: int
    steps: int
    final_loss: float
    final_token_acc: float
    checkpoint: Path
    runs: dict[str, Path] = field(default_factory=dict)

    @property
    def success_before(self) -> float:
        return sum(v == 1.0 for v in self.before.values()) / max(1, len(self.before))

    @property
    def success_after(self) -> float:
        return sum(v == 1.0 for v in self.after.values()) / max(1, len(self.after))

    def report(self) -> str:
        lines = [f"tasks: {', '.join(self.tasks)}; {self.samples} demonstration steps",
                 f"success before training: {self.success_before:.0%} {self.before}",
                 f"success after  training: {self.success_after:.0%} {self.after}",
                 f"training: {self.steps} steps, final loss {self.final_loss:.4f}, "
                 f"token accuracy {self.final_token_acc:.3f}",
                 "times: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.times_s.items())]
        return "\n".join(lines)


def write_tasks(path: Path, task_ids: tuple[str, ...] | list[str]) -> Path:
    """The bundled tasks ``task_ids`` as a task file."""
    from engine.tasks.schema import BUNDLED_TASKS

    lines = [line for line in BUNDLED_TASKS.read_text().splitlines() if line.strip()
             and json.loads(line)["task_id"] in task_ids]
    if len(lines) != len(task_ids):
        raise ValueError(f"not all of {task_ids} are bundled tasks")
    path.write_text("\n".join(lines) + "\n")
    return path


def rewards(run_dir: Path) -> dict[str, float]:
    """task id -> reward (0 when the episode has none) of a run."""
    from engine.store.records import reward_value
    from engine.store.run_dir import read_records

    return {str(r["task"]["task_id"]): float(reward_value(r) or 0.0) for r in read_records(run_dir)}


async def run_engine(tasks: Path, out: Path, base_url: str, policy_name: str, agent: Any = None,
                     model_dir: Path | None = None, max_tokens: int = 64,
                     step_caps: tuple[int, int, int] | None = None) -> Path:
    """One engine run of ``tasks`` (at most ``step_caps`` steps per difficulty); the run directory."""
    from engine.agent.model_api import SamplingParams
    from engine.clients.runner import run
    from engine.core.config import RunConfig
    from policy.registry import BackendConfig, make_policy

    kw: dict[str, Any] = {}
    if policy_name == "hf":
        kw = {"agent": agent, "sampling": SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0),
              "backend": BackendConfig(model=str(model_dir), device="cpu", max_batch=8)}
    cfg = RunConfig(tasks=str(tasks), output_dir=str(out), concurrency=4, workers=1, telemetry=None,
                    step_caps=step_caps)
    policy = make_policy(policy_name, **({k: kw[k] for k in ("agent", "sampling", "backend")} if kw else {}))
    _, run_dir = await run(cfg, policy, base_url)
    return Path(run_dir)


def run_demo(work: str | Path, *, tasks: tuple[str, ...] | list[str] = TASKS, arch: str = "qwen2_vl",
             hidden_size: int = 128, num_layers: int = 2, max_steps: int = 120, lr: float = 2e-3,
             cpu_threads: int | None = 1, seed: int = 0) -> DemoResult:
    """Steps 1-5 of the module docstring in ``work``; returns the figures."""
    import torch

    threads = torch.get_num_threads()
    if cpu_threads:
        # On a small, shared CPU, one intra-op thread is many times faster for a model this size than several
        # threads that wait for each other.
        torch.set_num_threads(cpu_threads)
    try:
        return _run_demo(Path(work), list(tasks), arch, hidden_size, num_layers, max_steps, lr, cpu_threads, seed)
    finally:
        torch.set_num_threads(threads)


def _run_demo(work: Path, tasks: list[str], arch: str, hidden_size: int, num_layers: int, max_steps: int,
              lr: float, cpu_threads: int | None, seed: int) -> DemoResult:
    from engine.agent.prompts import AgentConfig
    from engine.sites.server import SiteServer
    from engine.store.run_dir import read_records
    from policy.tiny_models import build_tiny_model
    from train.config import TrainConfig
    from train.trainer import samples_from_runs, train

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    task_file = write_tasks(work / "tasks.jsonl", tasks)
    template = work / "system.txt"
    template.write_text(SYSTEM_PROMPT)
    agent = AgentConfig(response_format="vanilla", window=0, template_file=str(template))
    times: dict[str, float] = {}
    runs: dict[str, Path] = {}
    with SiteServer() as server:
        t0 = time.perf_counter()
        runs["scripted"] = asyncio.run(run_engine(task_file, work / "runs", server.base_url, "scripted"))
        times["scripted run"] = time.perf_counter() - t0
        if min(rewards(runs["scripted"]).values()) != 1.0:
            raise RuntimeError(f"the scripted policy failed a task: {rewards(runs['scripted'])}")

        t0 = time.perf_counter()
        model_dir = build_tiny_model(work / "model", arch, seed, hidden_size=hidden_size, num_layers=num_layers)
        cfg = TrainConfig(model_dir=str(model_dir), output_dir=str(work / "train"), algorithm="fbc", lr=lr,
                          warmup_steps=min(10, max_steps // 10), schedule="cosine", min_lr_ratio=0.1,
                          max_steps=max_steps, batch_size=8, max_grad_norm=1.0, save_dtype="float32",
                          cpu_threads=cpu_threads, seed=seed, progress=False, log_every=10, agent=agent)
        samples = samples_from_runs(cfg, [runs["scripted"]])
        longest_reply = max(len(s.target_ids) for s in samples)
        # The model is judged on the demonstrated steps and a few more: a random model wanders to its cap.
        steps = max(len(r["steps"]) for r in read_records(runs["scripted"])) + 2
        caps = (steps, steps, steps)
        times["demonstrations + model"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        runs["before"] = asyncio.run(run_engine(task_file, work / "runs", server.base_url, "hf", agent, model_dir,
                                                longest_reply + 8, caps))
        times["evaluation before"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = train(cfg, samples)
        times["training"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        assert result.checkpoint is not None
        runs["after"] = asyncio.run(run_engine(task_file, work / "runs", server.base_url, "hf", agent,
                                               result.checkpoint, longest_reply + 8, caps))
        times["evaluation after"] = time.perf_counter() - t0
    last = result.history[-1]
    return DemoResult(list(tasks), rewards(runs["before"]), rewards(runs["after"]), times, len(samples), result.steps,
                      result.final_loss, float(last.get("token_acc", float("nan"))), result.checkpoint, runs)


def main(argv: list[str] | None = None) -> None:
    """Command line: run the demonstration and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--tasks", default=",".join(FULL_TASKS), help="comma-separated bundled task ids")
    parser.add_argument("--arch", default="qwen2_vl", choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bc-demo-") as tmp:
        result = run_demo(args.work or tmp, tasks=args.tasks.split(","), arch=args.arch, hidden_size=args.hidden_size,
                          num_layers=args.layers, max_steps=args.steps, lr=args.lr, cpu_threads=args.threads)
        print(result.report())


if __name__ == "__main__":
    main()
