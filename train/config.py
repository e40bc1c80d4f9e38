"""The trainer's configuration: one dataclass, loadable from a TOML (preferred), YAML or JSON file.

Every key is a field of :class:`TrainConfig` (flat, except the optional ``[agent]`` table: the agent protocol
that demonstrations are written in, :class:`engine.agent.prompts.AgentConfig`). Unknown keys, wrong types and
out-of-range values are refused with the file and the key in the message. An example, FBC on a Qwen3-VL::

    model_dir = "Qwen/Qwen3-VL-8B-Instruct"      # a local Hugging Face model directory
    output_dir = "checkpoints/fbc-iter-1"
    algorithm = "fbc"                             # fbc | grpo
    lr = 1e-6
    warmup_steps = 10
    schedule = "cosine"                           # cosine | constant
    epochs = 1                                    # or max_steps = 200 (max_steps wins)
    batch_size = 2                                # micro-batch per process
    grad_accum = 8
    bf16 = "auto"                                 # bf16 autocast where the GPU has it
    gradient_checkpointing = true
    save_every = 0                                # 0: only the final checkpoint

    [agent]                                       # how scripted runs become demonstrations
    response_format = "complete"
    window = 4
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from browserpool.typed_config import ConfigError, check_choices, config_from
from engine.agent.prompts import AgentConfig
from policy.compiled_blocks import CompileMode
from policy.vision_attention import VisionAttention
from policy.vision_mlp import VisionMlp

__all__ = ["ALGORITHMS", "NORMALISERS", "SCHEDULES", "Algorithm", "ConfigError", "Normaliser", "Schedule",
           "TrainConfig"]

Algorithm = Literal["fbc", "grpo"]
Schedule = Literal["cosine", "constant"]  # both after the linear warm-up
Normaliser = Literal["1/k", "1/|tau|"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
NORMALISERS: tuple[Normaliser, ...] = get_args(Normaliser)


@dataclass
class TrainConfig:
    """What one training iteration needs. Defaults follow the papers (WebGym's FBC, AsyncWebRL's GRPO)."""

    model_dir: str = ""  # required: the policy's Hugging Face model directory (weights, tokenizer, processor)
    output_dir: str = "checkpoints"
    algorithm: Algorithm = "fbc"

    # Optimiser (AdamW) and schedule.
    lr: float = 1e-6  # WebGym's FBC; AsyncWebRL's GRPO used 5e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Schedule = "cosine"
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    epochs: int = 1
    max_steps: int | None = None  # optimizer steps; overrides epochs when set
    batch_size: int = 1  # samples per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step
    max_tokens: int | None = None  # cap on padded tokens per micro-batch (batch_size * longest); packed: tokens
    # Sequence packing: each micro-batch as one row without padding, up to max_tokens tokens (train.packing)
    packing: bool = False
    max_grad_norm: float = 1.0  # 0 turns clipping off (the norm is still logged)
    # "auto": bf16 autocast on CUDA devices that support it; True forces, False never
    bf16: bool | Literal["auto"] = "auto"
    gradient_checkpointing: bool | Literal["vision"] = False  # true | false | "vision" (the vision tower's blocks only)
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda | cuda:N; under torchrun: cuda:LOCAL_RANK or cpu
    cpu_threads: int | None = None  # torch.set_num_threads for CPU training (None: torch's default)
    attn_implementation: str | None = None  # passed to from_pretrained (None: transformers' default, SDPA)
    # The vision tower's attention: varlen (one call per block for all images/windows) | default (transformers')
    vision_attention: VisionAttention = "varlen"
    # The vision MLP: aligned (Qwen2.5-VL's 3,420-wide MLP padded to 3,424 for the GPU's fast kernels) | default
    vision_mlp: VisionMlp = "aligned"
    # torch.compile of the repeated blocks: off | vision (the tower's blocks) | all (and the language model's layers)
    compile_blocks: CompileMode = "off"
    # Its torch.compile backend: inductor (generated kernels) | aot_eager or eager (the graphs without generated
    # kernels, to tell a compiler problem from a graph-capture one) | any other registered backend
    compile_backend: str = "inductor"
    seed: int = 0
    shuffle: bool = True
    bucket_window: int = 64  # length bucketing window (batches), see train.samples.bucket_batches

    # Logging and checkpoints.
    log_every: int = 1  # steps between metrics lines
    save_every: int = 0  # steps between checkpoints (0: only the final one)
    # auto (bfloat16 when training in bf16, else float32) | bfloat16 | float32
    save_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    progress: bool = True  # rich progress bar (rank 0)
    tensorboard: bool = True  # TensorBoard scalars when torch.utils.tensorboard imports
    plots: bool = True  # loss and reward curves as PNG (matplotlib)

    # GRPO / decoupled PPO (AsyncWebRL).
    is_cap: float | None = 5.0  # tokens whose behaviour->proximal weight exceeds this are dropped
    clip: float = 0.2
    dual_clip: float | None = 3.0
    normaliser: Normaliser = "1/k"
    k: float = 10.0
    # A control run, not a training method: each group's rewards permuted among its trajectories before the
    # advantages (train.algorithms.grpo_advantages), so the updates keep their sizes and carry no reward signal.
    shuffle_rewards: bool = False

    # FBC (WebGym): step selection over the runs given (oldest first).
    n_samples: int = 1800
    iterations_back: int = 4
    # position (WebGym's): (position + 1) ** recency_bias_power over the chronological pool of eligible steps;
    # iteration: recency ** age per iteration (see train.algorithms.fbc_select).
    recency_weighting: Literal["position", "iteration"] = "position"
    recency_bias_power: float = 2.0
    recency: float = 0.5
    loss_weight: Literal["uniform", "recency"] = "uniform"  # uniform | recency (see train.algorithms.chosen_selector)

    # Data.
    use_recorded_tokens: bool = True  # train on the generated token ids when recorded (else the reply text)
    agent: AgentConfig = field(default_factory=AgentConfig)  # protocol of the demonstrations (scripted runs)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def total_batch(self) -> int:
        """Samples per optimizer step on one process."""
        return self.batch_size * self.grad_accum

    def validate(self) -> None:
        """Raise :class:`ConfigError` for values the trainer cannot use."""
        def need(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"{key}: {what}, got {getattr(self, key)!r}")

        check_choices(self)
        need(bool(self.compile_backend), "compile_backend", "must name a torch.compile backend")
        need(math.isfinite(self.lr) and self.lr > 0, "lr", "must be > 0")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", "must be two numbers in [0, 1)")
        need(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        need(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
        need(self.epochs >= 1, "epochs", "must be >= 1")
        need(self.max_steps is None or self.max_steps >= 1, "max_steps", "must be >= 1")
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        need(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        need(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1")
        need(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        need(self.log_every >= 1, "log_every", "must be >= 1")
        need(self.save_every >= 0, "save_every", "must be >= 0")
        need(self.cpu_threads is None or self.cpu_threads >= 1, "cpu_threads", "must be >= 1")
        need(self.bucket_window >= 1, "bucket_window", "must be >= 1")
        need(self.is_cap is None or self.is_cap > 0, "is_cap", "must be > 0")
        need(0 < self.clip < 1, "clip", "must be in (0, 1)")
        need(self.dual_clip is None or self.dual_clip > 1, "dual_clip", "must be > 1")
        need(self.k > 0, "k", "must be > 0")
        need(self.n_samples >= 1, "n_samples", "must be >= 1")
        need(self.iterations_back >= 1, "iterations_back", "must be >= 1")
        need(0 < self.recency <= 1, "recency", "must be in (0, 1]")
        need(self.recency_weighting in ("position", "iteration"), "recency_weighting", "must be position or iteration")
        need(self.recency_bias_power >= 0, "recency_bias_power", "must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able), as stored beside the checkpoints."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> TrainConfig:
        """A config from plain data; ``source`` names the origin in error messages."""
        if isinstance(data, dict) and not data.get("model_dir"):
            raise ConfigError(f"{source}: model_dir is required (the policy's Hugging Face model directory)")
        return config_from(cls, data, source, strict=False)

    @classmethod
    def load(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Read ``path`` (``.toml``, ``.yaml``/``.yml`` or ``.json``); ``overrides`` replace keys of the file."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
        suffix = p.suffix.lower()
        try:
            if suffix == ".toml":
                import tomllib

                data: Any = tomllib.loads(text)
            elif suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            elif suffix == ".json":
                data = json.loads(text)
            else:
                raise ConfigError(f"{p}: unknown config format {suffix!r}; use .toml, .yaml or .json")
        except ConfigError:
            raise
        except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError
            raise ConfigError(f"{p}: invalid {suffix[1:].upper()}: {exc}") from None
        if isinstance(data, dict):
            data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        return cls.from_dict(data, str(p))

