"""The RL loop: roll out -> reward -> build samples -> train -> push the new weights, repeated.

``webgym-engine train CONFIG`` drives the engine through the library API
(:class:`engine.clients.service.RolloutService`), like an external framework would. The policy is the in-process ``hf``
backend (``policy = "hf"``) or a model served by vLLM or SGLang (``policy = "vllm" | "sglang"``, ``servers = [...]``):
after every update the new checkpoint is pushed into the running servers through their own weight-update APIs
(:mod:`policy.weight_sync`), nothing restarts, and every step records the version of the weights that produced its
reply.

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
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.agent.model_api import SamplingParams
from engine.clients.runner import load_task_source
from engine.clients.service import RolloutService
from engine.core.config import RunConfig
from engine.rewards.judge import JudgeConfig
from engine.rewards.programmatic import unrewardable
from engine.store.records import EpisodeRecord
from engine.tasks.miniwob import is_miniwob_spec, miniwob_mount
from policy.agent_policy import AgentPolicy
from policy.registry import make_judge
from train.algorithms import TRAINABLE_STATUSES
from train.config import TrainConfig
from train.evaluation import Evaluation, evaluate
from train.loop_config import LoopConfig
from train.policy_target import PolicyTarget, make_target
from train.rollout_pool import Group, RolloutPool
from train.utilization import CountingModel, Utilization

if TYPE_CHECKING:  # the trainer imports torch: only when the loop trains
    from train.samples import SampleSet
    from train.trainer import Trainer, TrainResult

@dataclass
class IterationReport:
    """What one iteration did."""

    iteration: int
    version: int  # the policy version trained from these samples
    episodes: int  # every record of the iteration's groups, reruns and excluded members included
    success_rate: float  # of the trained groups' episodes (the task's verdict: success / (success + failure))
    mean_steps: float  # the trained groups' mean episode length
    versions_seen: list[int]
    stale_dropped: int  # episodes of groups dropped for a step more than `staleness` versions behind
    max_staleness: int  # versions between the oldest step trained on and the version trained
    mean_staleness: float  # ... over the samples trained on
    samples: int
    skipped: dict[str, int]
    checkpoint: str | None
    # Where the rewards came from: every record's status, the members kept out of training (infrastructure
    # outcomes and unrewarded ones, never a training signal), the reruns that replaced them, the groups trained
    # and their sizes, and the groups dropped (why -> groups).
    outcomes: dict[str, int]
    excluded: int
    reruns: int
    groups_trained: int
    group_sizes: list[int]
    groups_dropped: dict[str, int]
    infra_trained: int  # samples from a record without the task's verdict: 0, or the loop has a bug
    # The trainer's GRPO figures over the iteration's steps (None for FBC or without an update).
    mean_is_weight: float | None
    clip_frac: float | None
    dropped_frac: float | None
    groups_ahead: int  # groups started beyond the ones trained so far, when the training began (sync: 0)
    wait_s: float  # waiting for the iteration's groups
    train_s: float
    push: dict[str, Any] | None  # policy.weight_sync.PushReport
    browser_busy: float | None  # fraction of episode slots holding an episode, over the iteration
    browser_busy_training: float | None  # ... while the trainer trained and the weights were pushed
    policy_idle: float | None  # fraction of the time with no policy request in flight, over the iteration
    policy_idle_training: float | None  # ... while the trainer trained and the weights were pushed


@dataclass
class LoopResult:
    """The loop's iterations and its held-out evaluations (``start``, ``end``; none without ``eval_tasks``)."""

    iterations: list[IterationReport]
    evaluations: list[Evaluation] = field(default_factory=list)


async def run_loop(cfg: LoopConfig, target: PolicyTarget | None = None,
                   service: RolloutService | None = None) -> LoopResult:
    """Run ``cfg.iterations`` iterations; returns one report per iteration (also in OUTPUT/loop.jsonl) and the
    held-out evaluations (OUTPUT/eval.jsonl).

    ``target``: the policy and its weight push, when the caller built them (benchmarks); else from ``cfg``.
    ``service``: an engine the caller configured (its own sites, workers, retries), not started yet: the loop
    starts and closes it; else one from ``cfg`` that serves the bundled sites."""
    from train.samples import Processing
    from train.trainer import samples_from_iterations

    out = Path(cfg.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_cfg = RunConfig(tasks=cfg.tasks, output_dir=str(out / "rollouts"), concurrency=cfg.concurrency,
                        workers=cfg.workers, reward=cfg.reward, telemetry=None, step_caps=cfg.step_caps,
                        traffic_group=cfg.samples_per_task if cfg.hold_group_web else 0)
    judge = (make_judge(JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model))
             if cfg.judge_base_url and cfg.reward != "program" else None)
    target = target or make_target(cfg)
    counted = CountingModel(target.model)
    policy = AgentPolicy(counted, cfg.train.agent, SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                                                 max_tokens=cfg.max_tokens))
    greedy = AgentPolicy(counted, cfg.train.agent, SamplingParams(temperature=cfg.eval_temperature, top_p=cfg.top_p,
                                                                 max_tokens=cfg.max_tokens, seed=cfg.train.seed))
    specs = [cfg.tasks, cfg.eval_tasks]
    mounts = miniwob_mount() if any(is_miniwob_spec(t) for t in specs if t) else None
    result = LoopResult([])
    service = service or RolloutService(run_cfg, serve_sites=True, site_mounts=mounts, judge=judge)
    async with service:
        assert service.base_url is not None and service.run_dir is not None
        tasks = load_task_source(cfg.tasks, service.base_url)
        eval_tasks = load_task_source(cfg.eval_tasks, service.base_url) if cfg.eval_tasks else []
        _warn_unrewardable([*tasks, *eval_tasks], judge is not None, cfg.reward)
        await target.start()
        if cfg.push_start:
            await target.sync.push(cfg.train.model_dir, 0)
        usage = Utilization({
            "browsers": lambda: (service.stats.states["W"] + service.stats.states["R"]) / cfg.concurrency,
            "policy_idle": lambda: float(counted.in_flight == 0)})
        pool = RolloutPool(service, tasks, policy, group_size=cfg.samples_per_task,
                           batch_groups=cfg.batch_groups or len(tasks),
                           staleness=cfg.staleness if cfg.mode == "async" else 0,
                           max_groups=cfg.iterations * (cfg.batch_groups or len(tasks)), seed=cfg.train.seed,
                           on_infra=cfg.on_infra)
        version, model_dir = 0, cfg.train.model_dir
        trainer: Trainer | None = None
        history: list[tuple[Path, list[EpisodeRecord]]] = []
        proc = Processing.load(model_dir)
        try:
            if eval_tasks and cfg.eval_start:
                result.evaluations.append(await _evaluation(service, eval_tasks, greedy, cfg, "start", version, out))
            usage.start()
            pool.start()
            for it in range(cfg.iterations):
                t0 = time.monotonic()
                groups = await pool.take(pool.batch_groups)
                t1 = time.monotonic()
                ahead = pool.started - (it + 1) * pool.batch_groups
                trained, dropped = _trainable_groups(groups, version, cfg.staleness)
                records = [r for g in trained for r in g.records]
                # Each iteration's own seed: its micro-batch order, and the control run's shuffle, differ.
                tcfg = dataclasses.replace(cfg.train, model_dir=str(model_dir), output_dir=str(out / f"iter-{it:03d}"),
                                           seed=cfg.train.seed + it)
                history.append((service.run_dir, records))
                # fbc draws from the last iterations (recency-weighted); grpo learns from the newest batch's groups.
                if tcfg.algorithm == "fbc":
                    samples = samples_from_iterations(tcfg, history, proc)
                else:
                    by_group = {f"{g.task.task_id}#{i}": g.records for i, g in enumerate(trained)}
                    samples = samples_from_iterations(tcfg, history[-1:], proc, groups=[by_group])
                trained_from = version
                trained_versions = [s.policy_version for s in samples.samples]
                checkpoint, push, t2, stats = None, None, None, _TrainFigures()
                if samples.samples:
                    train_result, trainer = await asyncio.to_thread(_train, trainer, tcfg, samples, cfg.keep_trainer)
                    checkpoint = str(train_result.checkpoint)
                    stats = _TrainFigures.of(train_result.history)
                    t2 = time.monotonic()
                    push = await target.sync.push(checkpoint, version + 1)
                    version, model_dir = version + 1, checkpoint
                pool.next_iteration(version)
                t3 = time.monotonic()
                _write_groups(out / f"iter-{it:03d}", trained, dropped)
                all_records = [r for g in groups for r in (*g.records, *g.excluded)]
                status_of = {r["episode_id"]: r.get("status") for r in records}
                report = IterationReport(
                    iteration=it, version=version, episodes=len(all_records),
                    success_rate=sum(r["status"] == "success" for r in records) / max(1, len(records)),
                    mean_steps=statistics.fmean(len(r["steps"]) for r in records) if records else math.nan,
                    versions_seen=sorted({v for r in all_records for s in r.get("steps") or []
                                          if (v := s.get("policy_version")) is not None}),
                    stale_dropped=sum(len(g.records) + len(g.excluded) for g, why in dropped if why == _STALE),
                    max_staleness=trained_from - min(trained_versions, default=trained_from),
                    mean_staleness=(statistics.fmean(trained_from - v for v in trained_versions)
                                    if trained_versions else 0.0),
                    samples=len(samples.samples), skipped=dict(samples.skipped), checkpoint=checkpoint,
                    outcomes=dict(Counter(str(r.get("status")) for r in all_records)),
                    excluded=sum(len(g.excluded) for g in groups), reruns=sum(g.reruns for g in groups),
                    groups_trained=len(trained), group_sizes=sorted(len(g.records) for g in trained),
                    groups_dropped=dict(Counter(why for _, why in dropped)),
                    infra_trained=sum(status_of.get(s.episode_id) not in TRAINABLE_STATUSES for s in samples.samples),
                    mean_is_weight=stats.mean_is_weight, clip_frac=stats.clip_frac, dropped_frac=stats.dropped_frac,
                    groups_ahead=ahead, wait_s=round(t1 - t0, 2), train_s=round((t2 or t3) - t1, 2),
                    push=dataclasses.asdict(push) if push else None,
                    browser_busy=usage.mean("browsers", t0, t3), browser_busy_training=usage.mean("browsers", t1, t3),
                    policy_idle=usage.mean("policy_idle", t0, t3),
                    policy_idle_training=usage.mean("policy_idle", t1, t3))
                result.iterations.append(report)
                _append_jsonl(out / "loop.jsonl", dataclasses.asdict(report))
            await pool.drain()  # nothing is left behind unrecorded
            if eval_tasks:
                result.evaluations.append(await _evaluation(service, eval_tasks, greedy, cfg, "end", version, out))
        finally:
            await pool.close()
            await usage.close()
            await target.close()
            if trainer is not None:
                trainer.close()
    return result


def _train(trainer: Trainer | None, cfg: TrainConfig, samples: SampleSet, keep: bool) -> tuple[TrainResult, Trainer]:
    """One iteration's training: on the kept trainer (``keep``, after the first), else on a new one that loads
    ``cfg.model_dir``."""
    from train.trainer import Trainer

    if trainer is None or not keep:
        if trainer is not None:
            trainer.close()
        trainer = Trainer(cfg, samples)
    else:
        trainer.next_iteration(cfg, samples)
    return trainer.run(), trainer


_STALE = "a step more than `staleness` versions behind"


def _trainable_groups(groups: list[Group], version: int, staleness: int) -> tuple[list[Group], list[tuple[Group, str]]]:
    """The groups to train on (complete, every member within ``staleness`` versions of ``version``) and the
    others with why."""
    trained, dropped = [], []
    for g in groups:
        if g.dropped is not None:
            dropped.append((g, g.dropped))
        elif any(version - _oldest_version(r, version) > staleness for r in g.records):
            dropped.append((g, _STALE))
        else:
            trained.append(g)
    return trained, dropped


@dataclass
class _TrainFigures:
    """GRPO's figures over one training's steps, weighted by the tokens each counts."""

    mean_is_weight: float | None = None
    clip_frac: float | None = None
    dropped_frac: float | None = None

    @classmethod
    def of(cls, history: list[dict[str, Any]]) -> _TrainFigures:
        kept = [(m["kept_tokens"], m) for m in history if m.get("kept_tokens")]
        target = [(m["target_tokens"], m) for m in history if m.get("target_tokens") and "dropped_frac" in m]
        if not kept and not target:
            return cls()

        def mean(pairs: list[tuple[float, dict[str, Any]]], key: str) -> float | None:
            total = sum(w for w, _ in pairs)
            return sum(w * m[key] for w, m in pairs) / total if total else None

        return cls(mean(kept, "mean_is_weight"), mean(kept, "clip_frac"), mean(target, "dropped_frac"))


async def _evaluation(service: RolloutService, tasks: list[Any], policy: AgentPolicy, cfg: LoopConfig, label: str,
                      version: int, out: Path) -> Evaluation:
    evaluation = await evaluate(service, tasks, policy, label=label, version=version, samples=cfg.eval_samples)
    _append_jsonl(out / "eval.jsonl", evaluation.to_dict())
    return evaluation


def _warn_unrewardable(tasks: list[Any], judge_configured: bool, reward: str) -> None:
    """Say before the first rollout how many tasks nothing can score (their groups are dropped, never trained)."""
    missing = unrewardable(tasks, judge_configured, reward)
    if missing:
        print(f"warning: {len(missing)} of {len(tasks)} tasks cannot be rewarded (no programmatic checks, no page "
              f"reward{', no judge' if not judge_configured else ''}); their groups are dropped, never trained on. "
              f"Give a judge (judge_base_url, judge_model) or checks.", file=sys.stderr, flush=True)


def _write_groups(folder: Path, trained: list[Group], dropped: list[tuple[Group, str]]) -> None:
    """``groups.json``: which episodes each group trained on and which it kept out (for audits: every trained
    episode has the task's verdict)."""
    def entry(g: Group, why: str | None) -> dict[str, Any]:
        return {"task_id": g.task.task_id, "started_version": g.started_version, "trained": why is None,
                "dropped": why, "episodes": [r["episode_id"] for r in g.records],
                "excluded": [{"episode_id": r["episode_id"], "status": r.get("status")} for r in g.excluded],
                "reruns": g.reruns}

    folder.mkdir(parents=True, exist_ok=True)
    rows = [entry(g, None) for g in trained] + [entry(g, why) for g, why in dropped]
    (folder / "groups.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def _append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(_rounded(row)) + "\n")


def _oldest_version(record: EpisodeRecord, default: int) -> int:
    versions = [v for s in record.get("steps") or [] if (v := s.get("policy_version")) is not None]
    return min(versions, default=default)


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 3) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj
