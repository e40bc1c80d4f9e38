"""The RL loop: roll out -> reward -> build samples -> train -> push the new weights, repeated.

``webgym-engine train CONFIG`` drives the engine through the library API (:class:`engine.api.RolloutService`),
like an external framework would. The policy is the in-process ``hf`` backend (``policy = "hf"``) or a model
served by vLLM or SGLang (``policy = "vllm" | "sglang"``, ``servers = [...]``): after every update the new
checkpoint is pushed into the running servers through their own weight-update APIs (:mod:`policy.weight_sync`),
nothing restarts, and every step records the version of the weights that produced its reply.

Rollouts come from a :class:`train.rollout_pool.RolloutPool`: groups of ``samples_per_task`` episodes of one task,
``batch_groups`` groups per iteration (every task once by default).

- ``mode = "async"`` (AsyncWebRL): the pool never stops. Each new group starts with the newest version; groups
  may run up to ``staleness`` versions ahead of the trainer, so the browsers and the policy keep working while
  the trainer trains and while the weights are pushed. Samples more than ``staleness`` versions behind the
  version being trained are dropped; the others are corrected by the decoupled PPO loss (``grpo``: behaviour
  log-probabilities recorded at rollout time).
- ``mode = "sync"`` (the original's loop): a batch at version ``i``, then training, then the push, then the next
  batch (the pool with ``staleness = 0``).

Each iteration's report (OUTPUT/loop.jsonl) says how busy the browsers were (the fraction of the engine's episode
slots holding an episode) and how idle the policy was (no request in flight), over the whole iteration and while
the trainer and the push ran, and what the push did (:class:`policy.weight_sync.PushReport`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.api import RolloutService
from engine.config import RunConfig
from engine.judge import JudgeConfig
from engine.miniwob import is_miniwob_spec, miniwob_mount
from engine.model_api import LOGPROBS_KINDS, SamplingParams
from engine.runner import load_task_source
from engine.tasks import StepCaps
from policy.agent_policy import AgentPolicy
from policy.registry import make_judge
from train.behaviour import REMEDY, untruncated_at_one
from train.config import ConfigError, TrainConfig
from train.policy_target import POLICIES, PolicyTarget, make_target
from train.rollout_pool import RolloutPool
from train.utilization import CountingModel, Utilization

MODES = ("sync", "async")


@dataclass
class LoopConfig:
    """The RL loop: what to roll out and how, the policy and its servers, and the trainer's own
    configuration (``[train]``)."""

    train: TrainConfig
    tasks: str = ""  # a task file, or miniwob[:names]
    iterations: int = 3
    mode: str = "sync"
    staleness: int = 2  # async: groups run at most this many versions ahead; older samples are dropped
    samples_per_task: int = 4  # rollouts of each task in a group (the GRPO group)
    batch_groups: int = 0  # groups trained per iteration; 0: one per task
    concurrency: int = 16
    workers: int = 1
    # The policy: "hf" (in-process, on `device`) or a served model, "vllm" | "sglang", on `servers`.
    policy: str = "hf"
    servers: list[str] = field(default_factory=list)  # API roots of the policy servers, e.g. http://h:8000/v1
    served_model: str = ""  # the name the servers serve the policy under (default: train.model_dir)
    push_mode: str = "abort"  # requests in flight during a push: "abort" (sent again) | "wait" (finish on old)
    logprobs_of: str = ""  # what the servers' log-probs are of; default: vllm "model", sglang "temperature"
    device: str = "auto"  # where the in-process rollout model runs
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
    output_dir: str = "rl"  # on storage the policy servers see at the same path (checkpoints are pushed from it)

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
        try:
            cfg = cls(train=TrainConfig.from_dict(train, f"{p} [train]"), **data)
        except TypeError as exc:
            raise ConfigError(f"{p}: {exc}") from None
        cfg.validate(str(p))
        return cfg

    def validate(self, source: str = "config") -> None:
        if self.mode not in MODES:
            raise ConfigError(f"{source}: mode must be one of {MODES}, not {self.mode!r}")
        if not self.tasks:
            raise ConfigError(f"{source}: 'tasks' (a task file or miniwob[:names]) is required")
        if self.iterations < 1 or self.samples_per_task < 1 or self.staleness < 0 or self.batch_groups < 0:
            raise ConfigError(f"{source}: iterations and samples_per_task must be >= 1, staleness and "
                              "batch_groups >= 0")
        if self.policy not in POLICIES:
            raise ConfigError(f"{source}: policy must be one of {POLICIES}, not {self.policy!r}")
        if self.policy != "hf" and not self.servers:
            raise ConfigError(f"{source}: policy = {self.policy!r} needs servers = [\"http://HOST:PORT/v1\", ...]")
        if self.push_mode not in ("abort", "wait"):
            raise ConfigError(f"{source}: push_mode must be 'abort' or 'wait', not {self.push_mode!r}")
        if self.logprobs_of and self.logprobs_of not in LOGPROBS_KINDS:
            raise ConfigError(f"{source}: logprobs_of must be one of {LOGPROBS_KINDS}, not {self.logprobs_of!r}")
        sampling = {"temperature": self.temperature, "top_p": self.top_p}
        if self.train.algorithm == "grpo" and self.logprobs_of == "sampler" and not untruncated_at_one(sampling):
            raise ConfigError(f"{source}: GRPO cannot use the servers' log-probs of the sampler at temperature "
                              f"{self.temperature:g} / top_p {self.top_p:g} (the trainer cannot reproduce them): "
                              f"{REMEDY}")
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
    stale_dropped: int  # episodes with a step more than `staleness` versions behind
    max_staleness: int  # versions between the oldest step trained on and the version trained
    samples: int
    skipped: dict[str, int]
    checkpoint: str | None
    groups_ahead: int  # groups started beyond the ones trained so far, when the training began (sync: 0)
    wait_s: float  # waiting for the iteration's groups
    train_s: float
    push: dict[str, Any] | None  # policy.weight_sync.PushReport
    browser_busy: float | None  # fraction of episode slots holding an episode, over the iteration
    browser_busy_training: float | None  # ... while the trainer trained and the weights were pushed
    policy_idle: float | None  # fraction of the time with no policy request in flight, over the iteration
    policy_idle_training: float | None  # ... while the trainer trained and the weights were pushed


async def run_loop(cfg: LoopConfig, target: PolicyTarget | None = None) -> list[IterationReport]:
    """Run ``cfg.iterations`` iterations; returns one report per iteration (also in OUTPUT/loop.jsonl).

    ``target``: the policy and its weight push, when the caller built them (benchmarks); else from ``cfg``."""
    from train.samples import Processing
    from train.trainer import samples_from_iterations, train

    out = Path(cfg.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_cfg = RunConfig(tasks=cfg.tasks, output_dir=str(out / "rollouts"), concurrency=cfg.concurrency,
                        workers=cfg.workers, reward=cfg.reward, telemetry=None, step_caps=cfg.step_caps)
    judge = (make_judge(JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model))
             if cfg.judge_base_url and cfg.reward != "program" else None)
    target = target or make_target(cfg)
    counted = CountingModel(target.model)
    policy = AgentPolicy(counted, cfg.train.agent, SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                                                 max_tokens=cfg.max_tokens))
    mounts = miniwob_mount() if is_miniwob_spec(cfg.tasks) else None
    reports: list[IterationReport] = []
    async with RolloutService(run_cfg, serve_sites=True, site_mounts=mounts, judge=judge) as service:
        assert service.base_url is not None and service.run_dir is not None
        tasks = load_task_source(cfg.tasks, service.base_url)
        await target.sync.start()
        usage = Utilization({
            "browsers": lambda: (service.stats.states["W"] + service.stats.states["R"]) / cfg.concurrency,
            "policy_idle": lambda: float(counted.in_flight == 0)})
        pool = RolloutPool(service, tasks, policy, group_size=cfg.samples_per_task,
                           batch_groups=cfg.batch_groups or len(tasks),
                           staleness=cfg.staleness if cfg.mode == "async" else 0,
                           max_groups=cfg.iterations * (cfg.batch_groups or len(tasks)), seed=cfg.train.seed)
        version, model_dir = 0, cfg.train.model_dir
        history: list[tuple[Path, list[dict[str, Any]]]] = []
        proc = Processing.load(model_dir)
        usage.start()
        pool.start()
        try:
            for it in range(cfg.iterations):
                t0 = time.monotonic()
                groups = await pool.take(pool.batch_groups)
                t1 = time.monotonic()
                ahead = pool.started - (it + 1) * pool.batch_groups
                records = [r for g in groups for r in g.records]
                fresh = [r for r in records if version - _oldest_version(r, version) <= cfg.staleness]
                tcfg = dataclasses.replace(cfg.train, model_dir=str(model_dir), output_dir=str(out / f"iter-{it:03d}"))
                history.append((service.run_dir, fresh))
                # fbc draws from the last iterations (recency-weighted); grpo learns from the newest batch only.
                samples = samples_from_iterations(tcfg, history if tcfg.algorithm == "fbc" else history[-1:], proc)
                trained_from = version
                trained_versions = [s.policy_version for s in samples.samples]
                checkpoint, push, t2 = None, None, None
                if samples.samples:
                    result = await asyncio.to_thread(train, tcfg, samples)
                    checkpoint = str(result.checkpoint)
                    t2 = time.monotonic()
                    push = await target.sync.push(checkpoint, version + 1)
                    version, model_dir = version + 1, checkpoint
                    pool.set_version(version)
                t3 = time.monotonic()
                report = IterationReport(
                    iteration=it, version=version, episodes=len(records),
                    success_rate=sum(r["status"] == "success" for r in records) / max(1, len(records)),
                    versions_seen=sorted({s["policy_version"] for r in records for s in r["steps"]}),
                    stale_dropped=len(records) - len(fresh),
                    max_staleness=trained_from - min(trained_versions, default=trained_from),
                    samples=len(samples.samples), skipped=dict(samples.skipped), checkpoint=checkpoint,
                    groups_ahead=ahead, wait_s=round(t1 - t0, 2), train_s=round((t2 or t3) - t1, 2),
                    push=dataclasses.asdict(push) if push else None,
                    browser_busy=usage.mean("browsers", t0, t3), browser_busy_training=usage.mean("browsers", t1, t3),
                    policy_idle=usage.mean("policy_idle", t0, t3),
                    policy_idle_training=usage.mean("policy_idle", t1, t3))
                reports.append(report)
                with open(out / "loop.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps(_rounded(dataclasses.asdict(report))) + "\n")
            await pool.drain()  # nothing is left behind unrecorded
        finally:
            await pool.close()
            await usage.close()
            await target.sync.close()
    return reports


def _oldest_version(record: dict[str, Any], default: int) -> int:
    versions = [s["policy_version"] for s in record.get("steps") or [] if s.get("policy_version") is not None]
    return min(versions, default=default)


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 3) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj
