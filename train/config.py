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
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from engine.agent.prompts import AgentConfig
from policy.compiled_blocks import COMPILE_MODES
from policy.vision_attention import VISION_ATTENTION_MODES
from policy.vision_mlp import VISION_MLP_MODES
from train.model_io import CHECKPOINT_VISION

Algorithm = Literal["fbc", "grpo"]
Schedule = Literal["cosine", "constant"]  # both after the linear warm-up
Normaliser = Literal["1/k", "1/|tau|"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
NORMALISERS: tuple[Normaliser, ...] = get_args(Normaliser)


class ConfigError(ValueError):
    """A training configuration that cannot be used; the message names the file and the key."""


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
    bf16: bool | str = "auto"  # "auto": bf16 autocast on CUDA devices that support it; True forces, False never
    gradient_checkpointing: bool | str = False  # true | false | "vision" (the vision tower's blocks only)
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda | cuda:N; under torchrun: cuda:LOCAL_RANK or cpu
    cpu_threads: int | None = None  # torch.set_num_threads for CPU training (None: torch's default)
    attn_implementation: str | None = None  # passed to from_pretrained (None: transformers' default, SDPA)
    # The vision tower's attention: varlen (one call per block for all images/windows) | default (transformers')
    vision_attention: str = "varlen"
    # The vision MLP: aligned (Qwen2.5-VL's 3,420-wide MLP padded to 3,424 for the GPU's fast kernels) | default
    vision_mlp: str = "aligned"
    # torch.compile of the repeated blocks: off | vision (the tower's blocks) | all (and the language model's layers)
    compile_blocks: str = "off"
    # Its torch.compile backend: inductor (generated kernels) | aot_eager or eager (the graphs without generated
    # kernels, to tell a compiler problem from a graph-capture one) | any other registered backend
    compile_backend: str = "inductor"
    seed: int = 0
    shuffle: bool = True
    bucket_window: int = 64  # length bucketing window (batches), see train.samples.bucket_batches

    # Logging and checkpoints.
    log_every: int = 1  # steps between metrics lines
    save_every: int = 0  # steps between checkpoints (0: only the final one)
    save_dtype: str = "auto"  # auto (bfloat16 when training in bf16, else float32) | bfloat16 | float32
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
    recency_weighting: str = "position"
    recency_bias_power: float = 2.0
    recency: float = 0.5
    loss_weight: str = "uniform"  # uniform | recency (see train.algorithms.chosen_selector)

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

        need(self.algorithm in ALGORITHMS, "algorithm", f"must be one of {', '.join(ALGORITHMS)}")
        need(self.schedule in SCHEDULES, "schedule", f"must be one of {', '.join(SCHEDULES)}")
        need(self.normaliser in NORMALISERS, "normaliser", f"must be one of {', '.join(NORMALISERS)}")
        need(self.loss_weight in ("uniform", "recency"), "loss_weight", "must be uniform or recency")
        need(self.save_dtype in ("auto", "bfloat16", "float32"), "save_dtype", "must be auto, bfloat16 or float32")
        need(self.bf16 in ("auto", True, False), "bf16", 'must be "auto", true or false')
        need(self.gradient_checkpointing in (True, False, CHECKPOINT_VISION), "gradient_checkpointing",
             'must be true, false or "vision" (the vision tower only)')
        need(self.vision_attention in VISION_ATTENTION_MODES, "vision_attention",
             f"must be one of {', '.join(VISION_ATTENTION_MODES)}")
        need(self.vision_mlp in VISION_MLP_MODES, "vision_mlp", f"must be one of {', '.join(VISION_MLP_MODES)}")
        need(self.compile_blocks in COMPILE_MODES, "compile_blocks", f"must be one of {', '.join(COMPILE_MODES)}")
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
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a table of settings, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                close = [k for k in known if k.replace("_", "") == key.replace("_", "").replace("-", "")]
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {key!r}{hint}; known keys: {', '.join(sorted(known))}")
            if key == "agent":
                kwargs[key] = _agent(value, source)
                continue
            kwargs[key] = _coerce(value, hints[key], f"{source}: {key}")
        if not kwargs.get("model_dir"):
            raise ConfigError(f"{source}: model_dir is required (the policy's Hugging Face model directory)")
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

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


def _agent(value: Any, source: str) -> AgentConfig:
    if isinstance(value, AgentConfig):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: agent: expected a table ([agent]), got {type(value).__name__}")
    known = {f.name for f in fields(AgentConfig)}
    for key in value:
        if key not in known:
            raise ConfigError(f"{source}: agent: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
    try:
        return AgentConfig(**value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: agent: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the field's type, or ConfigError. TOML has no null: ``false`` switches optional caps off."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        if value is None and optional:
            return None
        if value is False and optional and bool not in rest:
            return None  # e.g. dual_clip = false
        errors = []
        for a in rest:
            try:
                return _coerce(value, a, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: expected {' or '.join(_name(a) for a in rest)}"
                          f"{' (or false for none)' if optional else ''}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args, strict=True))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # YAML 1.1 reads 1e-6 as a string: accept numeric strings.
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if hint is type(None):
        if value is not None:
            raise ConfigError(f"{where}: expected nothing, got {value!r}")
        return None
    raise ConfigError(f"{where}: unsupported setting type {hint!r}")  # pragma: no cover


def _name(hint: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))

