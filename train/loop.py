"""The RL loop: roll out -> reward -> build samples -> train -> new policy version, repeated.

``webgym-engine train CONFIG`` runs it with the in-process ``hf`` backend, whose weights are replaced in
place after every update (no restart; every step records the policy version that produced it). It drives
the engine through the library API (:class:`engine.api.RolloutService`), like an external framework would.

- ``mode = "sync"`` (the original's loop): the rollouts of iteration ``i`` all use version ``i``; training
  waits for them, the next rollouts wait for training.
- ``mode = "async"``: iteration ``i + 1``'s rollouts start before iteration ``i`` is trained, so browsers
  and the model keep working while the trainer runs; they may come back with older versions. Samples more
  than ``staleness`` versions behind the current one are dropped; the others are corrected by the
  decoupled PPO loss (``grpo``: behaviour log-probabilities recorded at rollout time).

A served model (vLLM) is updated the same way by the caller: restart ``vllm serve`` on the new checkpoint
(it is in Hugging Face format), or load it with vLLM's weight-update endpoint, then submit with the new
version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import RolloutService
from engine.config import RunConfig
from engine.judge import JudgeConfig
from engine.miniwob import is_miniwob_spec, miniwob_mount
from engine.model_api import SamplingParams
from engine.runner import load_task_source
from engine.tasks import StepCaps
from policy.agent_policy import AgentPolicy
from policy.hf_backend import HFModel
from policy.registry import make_judge
from train.config import ConfigError, TrainConfig

MODES = ("sync", "async")


@dataclass
class LoopConfig:
    """The RL loop: what to roll out and how, and the trainer's own configuration (``[train]``)."""

    train: TrainConfig
    tasks: str = ""  # a task file, or miniwob[:names]
    iterations: int = 3
    mode: str = "sync"
    staleness: int = 2  # async: drop samples more than this many versions behind
    samples_per_task: int = 4  # rollouts of each task per iteration (the GRPO group)
    concurrency: int = 16
    workers: int = 1
    device: str = "auto"  # where the rollout model runs
    max_batch: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    reward: str = "auto"
    # Step caps (easy, medium, hard) of the rollouts, the original's train caps (10, 20, 30) when not set:
    # shorter episodes for quick iterations.
    step_caps: tuple[int, int, int] | None = None
    judge_base_url: str | None = None
    judge_model: str = ""
    output_dir: str = "rl"

    @classmethod
    def load(cls, path: str | Path) -> LoopConfig:
        """Read a TOML file: the loop's keys at the top level, the trainer's in ``[train]``."""
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{p}: {exc}") from None
        train = data.pop("train", None)
        if not isinstance(train, dict):
            raise ConfigError(f"{p}: a [train] table is required (the trainer's configuration)")
        known = {f.name for f in dataclasses.fields(cls)} - {"train"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{p}: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(sorted(known))}")
        cfg = cls(train=TrainConfig.from_dict(train, f"{p} [train]"), **data)
        cfg.validate(str(p))
        return cfg

    def validate(self, source: str = "config") -> None:
        if self.mode not in MODES:
            raise ConfigError(f"{source}: mode must be one of {MODES}, not {self.mode!r}")
        if not self.tasks:
            raise ConfigError(f"{source}: 'tasks' (a task file or miniwob[:names]) is required")
        if self.iterations < 1 or self.samples_per_task < 1 or self.staleness < 0:
            raise ConfigError(f"{source}: iterations and samples_per_task must be >= 1, staleness >= 0")
        if self.step_caps is not None:
            try:
                StepCaps(train=tuple(self.step_caps))  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{source}: step_caps: {exc}") from None


@dataclass
class IterationReport:
    """What one iteration did."""

    iteration: int
    version: int  # the policy version trained from these samples
    episodes: int
    success_rate: float
    versions_seen: list[int]
    stale_dropped: int
    samples: int
    skipped: dict[str, int]
    checkpoint: str | None
    rollout_s: float
    train_s: float


async def run_loop(cfg: LoopConfig) -> list[IterationReport]:
    """Run ``cfg.iterations`` iterations; returns one report per iteration (also in OUTPUT/loop.jsonl)."""
    from train.samples import Processing
    from train.trainer import samples_from_iterations, train

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    run_cfg = RunConfig(tasks=cfg.tasks, output_dir=str(out / "rollouts"), concurrency=cfg.concurrency,
                        workers=cfg.workers, reward=cfg.reward, telemetry=None)
    judge = (make_judge(JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model))
             if cfg.judge_base_url and cfg.reward != "program" else None)
    model = HFModel(cfg.train.model_dir, device=cfg.device, max_batch=cfg.max_batch)
    policy = AgentPolicy(model, cfg.train.agent, SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                                               max_tokens=cfg.max_tokens))
    mounts = miniwob_mount() if is_miniwob_spec(cfg.tasks) else None
    reports: list[IterationReport] = []
    async with RolloutService(run_cfg, serve_sites=True, site_mounts=mounts, judge=judge) as service:
        assert service.base_url is not None and service.run_dir is not None
        tasks = load_task_source(cfg.tasks, service.base_url)
        if cfg.step_caps is not None:
            caps = StepCaps(train=tuple(cfg.step_caps))  # type: ignore[arg-type]
            tasks = [dataclasses.replace(t, step_caps=caps) for t in tasks]
        version, model_dir = 0, cfg.train.model_dir
        history: list[tuple[Path, list[dict[str, Any]]]] = []
        proc = Processing.load(model_dir)
        batch = service.submit(tasks, policy, cfg.samples_per_task, policy_version=version)
        for it in range(cfg.iterations):
            t0 = time.monotonic()
            records = await service.gather(batch)
            rollout_s = time.monotonic() - t0
            last = it + 1 == cfg.iterations
            if cfg.mode == "async" and not last:  # keep the browsers busy while training
                batch = service.submit(tasks, policy, cfg.samples_per_task, policy_version=version)
            fresh = [r for r in records if version - _oldest_version(r, version) <= cfg.staleness]
            tcfg = dataclasses.replace(cfg.train, model_dir=str(model_dir), output_dir=str(out / f"iter-{it:03d}"))
            history.append((service.run_dir, fresh))
            # fbc draws from the last iterations (recency-weighted); grpo learns from the newest group only.
            samples = samples_from_iterations(tcfg, history if tcfg.algorithm == "fbc" else history[-1:], proc)
            t1 = time.monotonic()
            checkpoint = None
            if samples.samples:
                result = await asyncio.to_thread(train, tcfg, samples)
                checkpoint = str(result.checkpoint)
                version, model_dir = version + 1, checkpoint
                await model.load_weights(checkpoint, version)
            train_s = time.monotonic() - t1
            if cfg.mode == "sync" and not last:
                batch = service.submit(tasks, policy, cfg.samples_per_task, policy_version=version)
            report = IterationReport(
                iteration=it, version=version, episodes=len(records),
                success_rate=sum(r["status"] == "success" for r in records) / max(1, len(records)),
                versions_seen=sorted({s["policy_version"] for r in records for s in r["steps"]}),
                stale_dropped=len(records) - len(fresh), samples=len(samples.samples),
                skipped=dict(samples.skipped), checkpoint=checkpoint, rollout_s=round(rollout_s, 2),
                train_s=round(train_s, 2))
            reports.append(report)
            with open(out / "loop.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(dataclasses.asdict(report)) + "\n")
        if cfg.mode == "async":
            await service.collect()  # nothing is left behind unrecorded
    return reports


def _oldest_version(record: dict[str, Any], default: int) -> int:
    versions = [s["policy_version"] for s in record.get("steps") or [] if s.get("policy_version") is not None]
    return min(versions, default=default)
