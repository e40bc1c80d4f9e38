"""The configuration of one engine core: what every client of it (``run``, the library service, the step-level
environments) shares. Policy backends and the judge are configured by whoever builds them (the command line,
a trainer) and handed to the core as objects."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, get_args

from browserpool.config import WorkerConfig
from browserpool.protocol import MissPolicy
from browserpool.typed_config import check_choices
from engine.episode.context import Mode, RewardMode, RolloutSettings
from engine.episode.traffic_plan import TrafficSettings
from engine.tasks.schema import BUNDLED_TASKS, StepCaps
from engine.web.blocklist import DEFAULT_TTL_S
from engine.web.bounds import PageLimits
from engine.web.domains import DEFAULT_DOMAIN_LIMIT, DEFAULT_DOMAIN_RATE

Order = Literal["longest_first", "file"]
ORDERS: tuple[Order, ...] = get_args(Order)


@dataclass
class RunConfig:
    """Everything one engine core needs; stored in the run's manifest. The core never writes to it."""

    tasks: str = str(BUNDLED_TASKS)
    concurrency: int = 32
    workers: int = max(1, os.cpu_count() or 1)
    mode: Mode = "async"
    # The order `run` starts its episodes in: "longest_first" (the episodes allowed the most steps first, so that
    # no long one is left to run alone at the end) or "file" (the task file's). The lock-step baseline
    # (mode "sync") always takes the file's order, as the original's batches do.
    order: Order = "longest_first"
    output_dir: str = "runs"
    run_dir: str | None = None  # an existing run directory to resume, or None: a new one under output_dir
    episodes: int | None = None  # default: every task once; more cycles over the tasks
    split: str = "train"
    # Steps allowed per difficulty bucket (easy, medium, hard) in this run, whatever the split; None: the
    # original's caps for the split (engine.tasks.schema.STEP_CAPS).
    step_caps: tuple[int, int, int] | None = None
    retry_lost: int = 1
    seed: int = 0
    policy_concurrency: int = 128
    ops_per_worker: int = 16
    listen: str | None = None
    spawn_workers: bool = True
    # CURVE for sockets on tcp (the worker socket, telemetry): the engine's secret key file and the allowed
    # client keys (a directory of *.key files or one file); ``insecure``: tcp without authentication.
    server_key: str | None = None
    allow_keys: str | None = None
    insecure: bool = False
    worker: WorkerConfig = field(default_factory=lambda: WorkerConfig(endpoint=""))
    reward: RewardMode = "auto"  # auto: the page's or the task's own checks, else the judge
    # Environment variables the browser workers must never inherit (API keys of the policy's and the judge's
    # servers); the worker environment drops well-known secret names besides.
    secret_env: tuple[str, ...] = ("OPENAI_API_KEY",)
    # Stragglers: once this fraction of the run has a record, the rest get `straggler_grace_s` more, then end
    # with an error record that says so. None: off (the default for the test split: evaluations wait).
    straggler_fraction: float | None = None
    straggler_grace_s: float = 30.0
    # Live telemetry for `webgym-engine monitor`: "ipc" (a socket in the run directory), "tcp://HOST:PORT"
    # (port may be *), or None (off). Costs nothing measurable with no monitor attached.
    telemetry: str | None = "ipc"
    # Resource bounds. An episode that runs past episode_timeout_s (wall clock, from its first browser lease,
    # retries included) ends with an error record of kind episode_timeout; one policy call (its backend's
    # retries included) that takes longer than policy_step_timeout_s ends its episode with kind
    # policy_timeout. None: no cap. page_limits: caps on page texts copied into prompts and records.
    # Why an error record and not a recorded `wait`: a wait the model never chose (no reply, no tokens) would
    # enter training data as the model's own action, and a server that hung once mostly hangs again; an error
    # record keeps the trajectory honest, is left out of training like any error, and --resume can rerun it.
    episode_timeout_s: float | None = 900.0
    policy_step_timeout_s: float | None = 300.0
    page_limits: PageLimits = field(default_factory=PageLimits)
    # Websites (engine.web.domains, engine.web.blocklist): at most domain_limit episodes at once per domain (0: no cap;
    # the engine's own sites have none); domains on the blocklist (a JSON file: None means blocklist.json in the
    # run directory) are skipped with a record until their entry expires after blocklist_ttl_s. Actions sent to one
    # domain's pages are spaced to at most domain_rate per second (0: no cap).
    domain_limit: int = DEFAULT_DOMAIN_LIMIT
    domain_rate: float = DEFAULT_DOMAIN_RATE
    blocklist: str | None = None
    blocklist_ttl_s: float = DEFAULT_TTL_S
    # Page traffic (engine.episode.traffic_plan): record every episode's into RUN_DIR/traffic, replay a run's
    # recording (a request it lacks: traffic_miss, a 404 or the live site), or, for GRPO groups of traffic_group
    # samples, let each group's first member record what the others replay.
    record_traffic: bool = False
    replay_traffic: str | None = None
    traffic_miss: MissPolicy = "404"
    traffic_group: int = 0

    def traffic_settings(self) -> TrafficSettings:
        """The run's traffic choice, as the rollouts' plan takes it."""
        return TrafficSettings(record=self.record_traffic, replay=self.replay_traffic, miss=self.traffic_miss,
                               group=self.traffic_group)

    def run_step_caps(self) -> StepCaps | None:
        """``step_caps`` for both splits (None: each task's own)."""
        if self.step_caps is None:
            return None
        return StepCaps(train=tuple(self.step_caps), test=tuple(self.step_caps))  # type: ignore[arg-type]

    def rollout_settings(self, policy_version: int = 0) -> RolloutSettings:
        """The per-rollout settings of this run (every client of the core uses these)."""
        return RolloutSettings(split=self.split, retry_lost=self.retry_lost, mode=self.mode,
                               policy_version=policy_version, reward=self.reward,
                               episode_timeout_s=self.episode_timeout_s,
                               policy_step_timeout_s=self.policy_step_timeout_s, page_limits=self.page_limits,
                               step_caps=self.run_step_caps())

    def __post_init__(self) -> None:
        for name in ("episode_timeout_s", "policy_step_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                setattr(self, name, None)  # 0 or less: no cap
        check_choices(self, "RunConfig")
        if self.domain_limit < 0 or self.domain_rate < 0 or self.blocklist_ttl_s <= 0:
            raise ValueError("RunConfig.domain_limit and domain_rate must be >= 0 and blocklist_ttl_s > 0")
        self.run_step_caps()  # validates them
        if self.straggler_fraction is not None and not 0 < self.straggler_fraction <= 1:
            raise ValueError("RunConfig.straggler_fraction must be in (0, 1]")
        if self.traffic_group < 0 or (self.replay_traffic is not None and (self.record_traffic or self.traffic_group)):
            raise ValueError("RunConfig: replay_traffic replays a recording: it goes with neither record_traffic nor "
                             "traffic_group (>= 0)")
        if self.concurrency < 1 or self.workers < 1:
            raise ValueError("RunConfig.concurrency and RunConfig.workers must be at least 1")
        if self.telemetry == "off":
            self.telemetry = None
        if self.telemetry is not None and not (self.telemetry == "ipc" or self.telemetry.startswith(("tcp://", "ipc://"))):
            raise ValueError("RunConfig.telemetry must be 'ipc', 'tcp://HOST:PORT', 'ipc://PATH' or None, "
                             f"not {self.telemetry!r}")
