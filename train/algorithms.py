"""The training algorithms' arithmetic, with no model: step selection, advantages, the policy loss.

- :func:`fbc_select`: WebGym's filtered behaviour cloning (REINFORCE with a binary reward and no negative
  gradient): steps of successful trajectories whose screenshot changed after the action, sampled from the
  last iterations with recency weights (WebGym's ``(position + 1) ** recency_bias_power`` over the
  chronological pool, or ``recency ** age`` per iteration).
- :func:`grpo_advantages`: AsyncWebRL's group-normalised rewards (one group = the trajectories of one task),
  spread over a trajectory's steps with a constant ``1/k`` (the default) or ``1/|tau|``.
- :func:`decoupled_ppo_loss`: AsyncWebRL's decoupled PPO: the behaviour-to-proximal importance weight applied
  unclipped per token (tokens whose weight exceeds a cap dropped), PPO clipping on the current-to-proximal
  ratio only, and dual clipping for negative advantages.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from engine.store.records import ActionRecord, EpisodeRecord, StepRecord, TaskRecord, reward_value

# ---------------------------------------------------------------------------------------------- FBC


@dataclass(slots=True)
class ChosenStep:
    """A step chosen by :func:`fbc_select`."""

    run_index: int  # the run's position in fbc_select's input (its iteration; the newest is last)
    age: int  # iterations before the newest (0 = newest)
    episode_id: str
    step: int  # the step's index in record["steps"]
    weight: float  # its recency weight (RECENCY_WEIGHTINGS): what the sampling was proportional to
    record: EpisodeRecord = field(repr=False)

    @property
    def step_record(self) -> StepRecord:
        return self.record["steps"][self.step]


#: The end states a trajectory is trained on: the task's own verdict, yes or no (:mod:`engine.store.records`).
#: The others (``unrewarded``, ``blocked``, ``error`` of any kind, ``judge_pending``: a judge that gave no verdict) say
#: nothing about the policy: infrastructure caused them or nothing scored them, so they never become a training signal.
TRAINABLE_STATUSES = ("success", "failure")


def is_trainable(record: EpisodeRecord) -> bool:
    """The record's reward is the task's verdict on the policy: status ``success`` or ``failure`` (a record
    written by hand without a status: a reward value) and a reward value."""
    status = record.get("status")
    value = reward_value(record)
    return (status is None or status in TRAINABLE_STATUSES) and isinstance(value, int | float)


def is_success(record: EpisodeRecord) -> bool:
    """The trajectory solved its task: a trainable record (:func:`is_trainable`) of reward 1."""
    return is_trainable(record) and reward_value(record) == 1.0


def fbc_eligible(step: StepRecord) -> bool:
    """The original's step filter: the action changed the page, or it is the final ``answer`` (which has no
    next screenshot and is what makes the trajectory succeed)."""
    action: ActionRecord | dict[str, Any] = step.get("action") or {}
    if action.get("name") == "answer":
        return True
    return step.get("page_changed") is True


RECENCY_WEIGHTINGS = ("position", "iteration")


def fbc_select(records: Sequence[Sequence[EpisodeRecord]], iterations_back: int = 4, recency: float = 0.5,
               n_samples: int = 1800, seed: int = 0, weighting: str = "position",
               recency_bias_power: float = 2.0) -> list[ChosenStep]:
    """Filtered behaviour cloning's training steps.

    ``records[i]`` are the records of iteration ``i`` (one run each, oldest first, newest last). Only the last
    ``iterations_back`` iterations count. A step qualifies when its trajectory succeeded (:func:`is_success`)
    and :func:`fbc_eligible` holds. Each qualifying step gets a recency weight:

    - ``weighting="position"`` (WebGym's): the qualifying steps form one chronological pool (oldest iteration
      first, then record and step order); the step at 0-based position ``i`` weighs
      ``(i + 1) ** recency_bias_power`` (WebGym's ``recency_bias_power``, 2 by default), so the newest steps
      weigh most and every step is older than the next;
    - ``weighting="iteration"``: ``recency ** age`` (age 0 = newest iteration; 0.5 halves the weight per
      iteration back: 1, 1/2, 1/4, 1/8).

    ``n_samples`` steps are drawn without replacement with probability proportional to the weights
    (Efraimidis-Spirakis: the largest ``u ** (1 / w)``); when fewer qualify, all are taken. The weights are
    already in the draw: train the chosen steps with equal loss weights (``ChosenStep.weight`` is informative).

    Returns the chosen steps, newest iteration first, then in record order.
    """
    if iterations_back < 1 or not 0 < recency <= 1 or n_samples < 0 or recency_bias_power < 0:
        raise ValueError("need iterations_back >= 1, 0 < recency <= 1, n_samples >= 0, recency_bias_power >= 0")
    if weighting not in RECENCY_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {RECENCY_WEIGHTINGS}, not {weighting!r}")
    newest = len(records) - 1
    pool: list[ChosenStep] = []
    for run_index in range(max(0, len(records) - iterations_back), len(records)):
        age = newest - run_index
        for record in records[run_index]:
            if not is_success(record):
                continue
            for i, step in enumerate(record.get("steps") or []):
                if fbc_eligible(step):
                    weight = (len(pool) + 1) ** recency_bias_power if weighting == "position" else recency ** age
                    pool.append(ChosenStep(run_index, age, str(record.get("episode_id")), i, weight, record))
    if len(pool) <= n_samples:
        picked = list(range(len(pool)))
    else:
        rng = np.random.default_rng(seed)
        weights = np.asarray([c.weight for c in pool], dtype=np.float64)
        # log(u) / w orders like u ** (1/w), without underflow for small weights.
        keys = np.log(rng.random(len(pool))) / weights
        picked = np.argpartition(-keys, n_samples - 1)[:n_samples].tolist() if n_samples else []
    return [pool[i] for i in sorted(picked, key=lambda i: (pool[i].age, i))]


def chosen_selector(chosen: Iterable[ChosenStep], loss_weight: str = "uniform"
                    ) -> Callable[[int, EpisodeRecord, StepRecord], float | None]:
    """A ``select`` for :func:`train.samples.build_samples` that keeps exactly the chosen steps (pass the same
    run directories, in the same order, as the records given to :func:`fbc_select`).

    ``loss_weight``: ``"uniform"`` (1.0: the recency is already in the draw) or ``"recency"`` (the step's
    recency weight, for a variant that takes every qualifying step and weights the loss instead).
    """
    if loss_weight not in ("uniform", "recency"):
        raise ValueError("loss_weight must be 'uniform' or 'recency'")
    keys = {(c.run_index, c.episode_id, c.step): (1.0 if loss_weight == "uniform" else c.weight) for c in chosen}

    def select(run_index: int, record: EpisodeRecord, step: StepRecord) -> float | None:
        index = record["steps"].index(step) if step.get("step") is None else int(step["step"])
        return keys.get((run_index, str(record.get("episode_id")), index))

    return select


# ---------------------------------------------------------------------------------------------- GRPO


@dataclass(slots=True)
class TrajectoryAdvantage:
    """One trajectory's share of :func:`grpo_advantages`."""

    task_id: str
    episode_id: str
    reward: float
    normalised: float  # (reward - group mean) / (group std + eps)
    steps: list[float]  # each step's advantage: normalised * (1/k or 1/|tau|)
    record: EpisodeRecord = field(repr=False)


@dataclass
class GRPOResult:
    """Advantages of the kept groups, and the groups (task ids) left out with the reason."""

    trajectories: list[TrajectoryAdvantage] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # task_id -> why
    excluded: Counter[str] = field(default_factory=Counter)  # status -> trajectories left out (not trainable)

    @property
    def unrewarded(self) -> int:
        """Trajectories left out before grouping (:func:`is_trainable` false), whatever their status."""
        return sum(self.excluded.values())

    def by_episode(self) -> dict[str, list[float]]:
        """episode_id -> the step advantages (episode ids are unique within one run)."""
        return {t.episode_id: t.steps for t in self.trajectories}


def _task_id(record: EpisodeRecord) -> str:
    task: TaskRecord | dict[str, Any] = record.get("task") or {}
    return str(task.get("task_id", record.get("task_id")))


def grpo_advantages(groups: Mapping[str, Sequence[EpisodeRecord]] | Iterable[EpisodeRecord],
                    normaliser: str = "1/k", k: float = 10, eps: float = 1e-6,
                    shuffle_seed: int | None = None) -> GRPOResult:
    """Group-normalised advantages per step.

    ``groups``: a group's key (e.g. its task id) -> its trajectories (records), or a plain iterable of records,
    grouped here by their task id. Only trainable records count (:func:`is_trainable`: the task's own verdict;
    the others are counted in ``excluded`` by status). In each group the reward ``r``
    (``record["reward"]["value"]``) becomes ``(r - mean) / (std + eps)`` with the population std (ddof 0); every
    step of the trajectory gets that times ``1/k`` (``normaliser="1/k"``, AsyncWebRL's constant, so long failed
    trajectories are not under-weighted) or ``1/|tau|`` (``"1/|tau|"``, the trajectory's number of steps). A
    group whose rewards all agree (including a group of one) carries no signal and is skipped, with the reason.

    ``shuffle_seed``: a control, not a training method: each group's rewards are permuted among its trajectories
    (seeded) before they are normalised, so updates keep their sizes but say nothing about which trajectory was
    rewarded.
    """
    if normaliser not in ("1/k", "1/|tau|"):
        raise ValueError("normaliser must be '1/k' or '1/|tau|'")
    if normaliser == "1/k" and k <= 0:
        raise ValueError("k must be > 0")
    if isinstance(groups, Mapping):
        grouped = {str(tid): list(recs) for tid, recs in groups.items()}
    else:
        grouped = {}
        for record in groups:
            grouped.setdefault(_task_id(record), []).append(record)
    result = GRPOResult()
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    for task_id, recs in grouped.items():
        rewarded = [r for r in recs if is_trainable(r)]
        result.excluded.update(str(r.get("status", "no reward")) for r in recs if not is_trainable(r))
        if not rewarded:
            result.skipped[task_id] = "no rewarded trajectories"
            continue
        # Trainable records (is_trainable): each reward value is a number.
        rewards = np.asarray([float(cast(float, reward_value(r))) for r in rewarded], dtype=np.float64)
        if rng is not None:
            rewards = rng.permutation(rewards)
        std = float(rewards.std())
        if len(rewarded) < 2 or std == 0.0:
            result.skipped[task_id] = (f"zero reward variance: {len(rewarded)} trajectories, all with reward "
                                       f"{rewards[0]:g}")
            continue
        mean = float(rewards.mean())
        for record, reward in zip(rewarded, rewards, strict=True):
            normalised = (float(reward) - mean) / (std + eps)
            n_steps = len(record.get("steps") or [])
            scale = 1.0 / k if normaliser == "1/k" else (1.0 / n_steps if n_steps else 0.0)
            result.trajectories.append(TrajectoryAdvantage(
                task_id, str(record.get("episode_id")), float(reward), normalised, [normalised * scale] * n_steps,
                record))
    return result


def assign_advantages(samples: Iterable[Any], result: GRPOResult) -> list[Any]:
    """Set ``sample.advantage`` from ``result`` (matched on episode id and step; one run's samples) and return
    the samples that have one (samples of skipped groups are left out)."""
    by_episode = result.by_episode()
    kept = []
    for sample in samples:
        steps = by_episode.get(sample.episode_id)
        if steps is not None and 0 <= sample.step < len(steps):
            sample.advantage = steps[sample.step]
            kept.append(sample)
    return kept


# ---------------------------------------------------------------------------------------------- decoupled PPO


def decoupled_ppo_loss(logp_theta: Any, logp_prox: Any, logp_behave: Any, advantages: Any, mask: Any,
                       clip: float = 0.2, dual_clip: float | None = 3.0,
                       is_cap: float | None = 5.0) -> tuple[Any, dict[str, float]]:
    """The decoupled PPO loss (torch tensors; ``(B, T)`` per-token log-probs, ``advantages`` ``(B, T)`` or
    ``(B,)``, ``mask`` ``(B, T)``: the tokens that count).

    - ``w = exp(logp_prox - logp_behave)``: the importance weight from the behaviour policy (the one that
      sampled, possibly stale) to the proximal policy (the weights before this update), applied as a
      per-token factor, unclipped and without gradient; tokens with ``w > is_cap`` are dropped from the loss.
    - ``ratio = exp(logp_theta - logp_prox)``: PPO's ratio, clipped to ``[1 - clip, 1 + clip]`` with the
      pessimistic min: ``obj = min(ratio * A, clip(ratio) * A)``.
    - dual clip for ``A < 0``: ``obj = max(obj, dual_clip * A)`` (a huge ratio on a bad token cannot blow up).
    - loss = ``-sum(w * obj * keep) / sum(mask)``: dropped tokens count as zeros in a mean over every token of the
      loss mask, as AReaL's ``ppo_actor_loss_fn`` normalises (by the loss mask's count, not by the kept tokens:
      dropping tokens shrinks the step instead of scaling the rest up by ``1 / (1 - dropped fraction)``); 0 when
      the mask is empty.

    Returns ``(loss, stats)``: ``dropped_frac`` (masked tokens dropped by the cap), ``clip_frac`` (kept tokens
    whose clipped term was taken), ``dual_clip_frac``, ``kept_tokens``, ``mean_is_weight``, ``mean_ratio``.
    """
    import torch

    mask = mask.bool()
    adv = advantages if advantages.dim() == logp_theta.dim() else advantages.unsqueeze(-1)
    adv = adv.to(logp_theta.dtype).expand_as(logp_theta)
    w = torch.exp((logp_prox - logp_behave).detach())
    keep = mask if is_cap is None else mask & (w <= is_cap)
    ratio = torch.exp(logp_theta - logp_prox.detach())
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv
    obj = torch.minimum(surr1, surr2)
    dual = torch.zeros_like(keep)
    if dual_clip is not None:
        floor = dual_clip * adv
        dual = (adv < 0) & (obj < floor)
        obj = torch.where(adv < 0, torch.maximum(obj, floor), obj)
    keep_f = keep.to(obj.dtype)
    n_keep = keep_f.sum()
    loss = -(w * obj * keep_f).sum() / mask.sum().to(obj.dtype).clamp(min=1.0)
    clipped = ((adv > 0) & (ratio > 1.0 + clip)) | ((adv < 0) & (ratio < 1.0 - clip))
    n_mask = int(mask.sum())
    kept = int(n_keep)

    def frac(x: Any, n: int) -> float:
        return float((x & keep).sum()) / n if n else 0.0

    stats = {
        "dropped_frac": float((mask & ~keep).sum()) / n_mask if n_mask else 0.0,
        "clip_frac": frac(clipped, kept),
        "dual_clip_frac": frac(dual, kept),
        "kept_tokens": float(kept),
        "mean_is_weight": float(w[keep].mean()) if kept else math.nan,
        "mean_ratio": float(ratio.detach()[keep].mean()) if kept else math.nan,
    }
    return loss, stats
