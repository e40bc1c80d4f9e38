"""The RL loop's configuration (``webgym-engine train CONFIG``): a TOML file, the loop's keys at the top level and the
trainer's (:class:`train.config.TrainConfig`) in ``[train]``."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from browserpool.typed_config import check_choices, config_from
from engine.agent.model_api import LogprobsKind
from engine.episode.context import RewardMode
from engine.tasks.schema import StepCaps
from policy.weight_sync import PushMode
from train.behaviour import REMEDY, untruncated_at_one
from train.config import ConfigError, TrainConfig
from train.rollout_pool import InfraAction

PolicyName = Literal["hf", "vllm", "sglang", "stand_in"]
POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)
SERVED = ("vllm", "sglang")  # the policies whose servers the config names
LoopMode = Literal["sync", "async"]


@dataclass
class LoopConfig:
    """The RL loop: what to roll out and how, the policy and its servers, and the trainer's own
    configuration (``[train]``)."""

    train: TrainConfig
    tasks: str = ""  # a task file, or miniwob[:names]
    iterations: int = 3
    mode: LoopMode = "sync"
    staleness: int = 2  # async: groups run at most this many versions ahead; older samples are dropped
    samples_per_task: int = 4  # rollouts of each task in a group (the GRPO group)
    batch_groups: int = 0  # groups trained per iteration; 0: one per task
    concurrency: int = 16
    workers: int = 1
    # The policy: "hf" (in-process, on `device`) or a served model, "vllm" | "sglang", on `servers`.
    policy: PolicyName = "hf"
    servers: list[str] = field(default_factory=list)  # API roots of the policy servers, e.g. http://h:8000/v1
    served_model: str = ""  # the name the servers serve the policy under (default: train.model_dir)
    push_mode: PushMode = "abort"  # requests in flight during a push: "abort" (sent again) | "wait" (finish on old)
    # The servers serve other weights than train.model_dir (started on the base model; a run resumed from a
    # checkpoint): push train.model_dir into them, as version 0, before the first rollout.
    push_start: bool = False
    # What the servers' log-probs are of (engine.agent.model_api); "": vllm "model", sglang "temperature".
    logprobs_of: LogprobsKind | Literal[""] = ""
    device: str = "auto"  # where the in-process rollout model runs
    max_batch: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    reward: RewardMode = "auto"
    # A member of a group that ends without the task's verdict (an error, a lost worker, a straggler, a judge
    # without a verdict): "rerun" it on the same task, so the group keeps its size, or "drop" the group
    # (train.rollout_pool). Blocked and unrewarded members always drop their group: a rerun cannot help.
    on_infra: InfraAction = "rerun"
    # Each group's first member records its page traffic and the others replay its start page, so that the group
    # starts from one page (engine.episode.traffic_plan; docs/repeatable.md).
    hold_group_web: bool = False
    # Step caps (easy, medium, hard) of the rollouts, the original's train caps (10, 20, 30) when not set:
    # shorter episodes for quick iterations.
    step_caps: tuple[int, int, int] | None = None
    # The trainer stays in memory from one iteration to the next (its weights and its optimizer's moments, as an
    # RL framework's actor), instead of loading the last checkpoint into a fresh optimizer every iteration.
    keep_trainer: bool = True
    # Held-out evaluation (train.evaluation): a task file run eval_samples times per task, before the first
    # update and after the last, at eval_temperature (0: greedy); OUTPUT/eval.jsonl. "": none.
    eval_tasks: str = ""
    eval_samples: int = 1
    eval_temperature: float = 0.0
    # Off: no evaluation before the first update (another run from the same checkpoint measured it already).
    eval_start: bool = True
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
        if not isinstance(data.get("train"), dict):
            raise ConfigError(f"{p}: a [train] table is required (the trainer's configuration)")
        if not data["train"].get("model_dir"):
            raise ConfigError(f"{p}: train.model_dir is required (the policy's Hugging Face model directory)")
        cfg = config_from(cls, data, str(p), strict=False)
        cfg.validate(str(p))
        return cfg

    def __post_init__(self) -> None:
        check_choices(self)

    def validate(self, source: str = "config") -> None:
        """Raise :class:`ConfigError` for settings the loop cannot run with (the choices, and how they combine)."""
        check_choices(self, source)
        if not self.tasks:
            raise ConfigError(f"{source}: 'tasks' (a task file or miniwob[:names]) is required")
        if self.iterations < 1 or self.samples_per_task < 1 or self.staleness < 0 or self.batch_groups < 0:
            raise ConfigError(f"{source}: iterations and samples_per_task must be >= 1, staleness and "
                              "batch_groups >= 0")
        if self.policy in SERVED and not self.servers:
            raise ConfigError(f"{source}: policy = {self.policy!r} needs servers = [\"http://HOST:PORT/v1\", ...]")
        sampling = {"temperature": self.temperature, "top_p": self.top_p}
        if self.train.algorithm == "grpo" and self.logprobs_of == "sampler" and not untruncated_at_one(sampling):
            raise ConfigError(f"{source}: GRPO cannot use the servers' log-probs of the sampler at temperature "
                              f"{self.temperature:g} / top_p {self.top_p:g} (the trainer cannot reproduce them): "
                              f"{REMEDY}")
        if self.eval_samples < 1 or self.eval_temperature < 0:
            raise ConfigError(f"{source}: eval_samples must be >= 1 and eval_temperature >= 0")
        if self.step_caps is not None:
            try:
                StepCaps(train=tuple(self.step_caps))  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{source}: step_caps: {exc}") from None
