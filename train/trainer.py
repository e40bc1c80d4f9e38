"""The trainer: plain torch on a transformers Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), FBC or GRPO.

One process on the CPU or one GPU, or several GPUs under ``torchrun`` with FSDP2 (``fully_shard`` on every
decoder layer and vision block, then on the root). What one optimizer step does:

- the step's micro-batches (``grad_accum`` per process; in a distributed run the step's ``world * grad_accum``
  micro-batches are dealt to the ranks, as a ``DistributedSampler`` would, repeating from the start to fill the
  last step) are collated (:class:`train.samples.Collator`; images decoded here), run forward, and their loss
  backpropagated; bf16 autocast where the device supports it (FSDP: a bf16 mixed-precision policy instead);
- each token's log-probability is taken from the logits in float32 (``log_softmax`` gathered at the label
  positions, shifted by one as HF does); only the positions that predict a label get logits at all
  (``logits_to_keep`` with a boolean mask), which keeps a 150k-word vocabulary affordable;
- the loss is a sum over the step's tokens divided by the whole step's count, known before the step from the
  samples (so ``grad_accum`` micro-batches of 1 equal one batch of ``grad_accum``, and ranks add up exactly):

  - ``fbc``: weighted token-mean NLL on the target tokens, ``sum_i w_i * nll_i / sum_i w_i`` over tokens (a
    sample's weight is its :attr:`Sample.weight`, from :func:`train.algorithms.fbc_select`);
  - ``grpo``: :func:`train.algorithms.decoupled_ppo_loss` with ``logp_theta`` from the forward,
    ``logp_prox`` the model's log-probs at the start of the update (one ``no_grad`` pass over every sample
    before the first optimizer step), ``logp_behave`` the recorded behaviour log-probs (the proximal ones
    when none were recorded) and the sample's advantage (:func:`train.algorithms.grpo_advantages`); the mean
    is over every target token of the step, tokens over the importance-weight cap counting as zeros (AReaL's
    normalisation by the loss mask);
- gradients clipped to ``max_grad_norm``, AdamW step, LR schedule step (linear warm-up, then cosine or
  constant).

Outputs in ``output_dir``: ``metrics.jsonl`` (one line per logged step: step, loss, lr, grad_norm, tokens/s
and the algorithm's statistics), ``loss.png`` / ``reward.png``, TensorBoard scalars under ``tensorboard/``
(when ``torch.utils.tensorboard`` imports), ``checkpoint-N/`` every ``save_every`` steps and ``final/``:
Hugging Face model directories (weights, config, and the source's tokenizer, chat template and
``preprocessor_config.json``) that :class:`policy.hf_backend.HFModel` and vLLM load as they are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policy.prompting import vision_token_ids
from train.config import TrainConfig
from train.samples import IGNORE_INDEX, Collator, Processing, Sample, SampleSet, bucket_batches

log = logging.getLogger(__name__)

#: Files of a model directory that the checkpoint takes from the source (save_pretrained writes the rest).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5")
_WRITTEN_BY_SAVE = ("config.json", "generation_config.json", "model.safetensors.index.json",
                    "pytorch_model.bin.index.json")


@dataclass
class TrainResult:
    """What :func:`train` produced."""

    checkpoint: Path | None  # the final checkpoint (None on ranks other than 0)
    steps: int
    tokens_per_s: float  # all tokens (prompt + target) through forward+backward per second, all ranks
    final_loss: float
    metrics_path: Path
    samples: int
    elapsed_s: float
    checkpoints: list[Path] = field(default_factory=list)  # every checkpoint written, the final one last
    history: list[dict[str, Any]] = field(default_factory=list)  # every step's metrics


# ---------------------------------------------------------------------------------------------- pieces


def model_class(config: Any) -> Any:
    """The transformers class for a Qwen-VL config (as :mod:`policy.hf_backend` finds it)."""
    import transformers

    with contextlib.suppress(Exception):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText._model_mapping[type(config)]
    archs = getattr(config, "architectures", None) or []
    cls = next((getattr(transformers, a) for a in archs if hasattr(transformers, a)), None)
    if cls is None:
        raise ValueError(f"no transformers class for model type {config.model_type!r}")
    return cls


def load_model(model_dir: str | Path, dtype: Any = None, attn_implementation: str | None = None) -> Any:
    """The model of ``model_dir`` in ``dtype`` (default float32: master weights for mixed precision)."""
    import torch
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    kwargs: dict[str, Any] = {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    kwargs["dtype" if major_minor >= (4, 56) else "torch_dtype"] = dtype or torch.float32
    return model_class(config).from_pretrained(model_dir, config=config, **kwargs)


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float = 0.0) -> float:
    """The LR multiplier after ``step`` optimizer steps: linear warm-up from 1/(warmup+1) to 1 over
    ``warmup_steps``, then constant or a cosine from 1 down to ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: Any, cfg: TrainConfig, total_steps: int) -> Any:
    """A ``LambdaLR`` with :func:`lr_factor`."""
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio))


def set_checkpointing(model: Any, on: bool) -> None:
    """Activation (gradient) checkpointing of every decoder layer and vision block, non-reentrant (works with
    FSDP2 and with inputs that need no grad); transformers >= 5.2x names it ``activation_checkpointing_*``."""
    if on:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def model_inputs(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """The forward's inputs of a collated batch, on ``device``."""
    keys = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")
    return {k: batch[k].to(device, non_blocking=True) for k in keys if k in batch}


def label_logprobs(model: Any, batch: dict[str, Any], device: Any) -> tuple[Any, Any, Any, Any]:
    """Log-probabilities of the label tokens under ``model``, flattened in row-major order of the labels.

    Returns ``(logp, targets, rows, logits)``: ``(N,)`` each with ``N`` the batch's label tokens (the float32
    log-prob of each label, the label ids, the batch row of each) and the ``(N, vocab)`` float32 logits.
    Position ``t - 1`` predicts ``labels[:, t]`` (HF's shift); only those positions are projected onto the
    vocabulary (``logits_to_keep`` as a boolean mask).
    """
    import torch

    labels = batch["labels"].to(device)
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX  # positions whose next token is a label
    targets = labels[:, 1:][keep[:, :-1]]
    rows = torch.arange(labels.shape[0], device=device).unsqueeze(1).expand_as(labels)[keep]
    inputs = model_inputs(batch, device)
    try:
        logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    except (IndexError, TypeError):
        # transformers before 5.2x takes only an int: project the kept positions' hidden states ourselves
        # rather than materialising the logits of every position (batch x length x vocabulary).
        hidden = model.model(**inputs, use_cache=False).last_hidden_state
        logits = model.lm_head(hidden[keep])
    if logits.dim() == 3 and logits.shape[:2] == labels.shape:  # a transformers that ignored the mask
        logits = logits[keep]
    logits = logits.reshape(-1, logits.shape[-1]).float()
    if logits.shape[0] != targets.shape[0]:
        raise RuntimeError(f"{logits.shape[0]} logits for {targets.shape[0]} labels")
    # The rollout sampled with vision placeholders suppressed (policy.hf_backend): the same distribution here.
    vision = torch.tensor(vision_token_ids(model.config), dtype=torch.long, device=logits.device)
    masked = logits.index_fill(-1, vision, float("-inf"))
    logp = torch.log_softmax(masked, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, targets, rows, logits


def copy_processor_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer, chat template and processor configs of ``src`` into the checkpoint ``dst``."""
    copied = []
    for path in sorted(Path(src).iterdir()):
        if not path.is_file() or path.name in _WRITTEN_BY_SAVE or path.name.endswith(_WEIGHT_SUFFIXES):
            continue
        if path.name.endswith(".index.json"):
            continue
        if path.suffix not in (".json", ".jinja", ".txt", ".model", ".tiktoken", ".py"):
            continue
        shutil.copy2(path, Path(dst) / path.name)
        copied.append(path.name)
    return copied


# ---------------------------------------------------------------------------------------------- distributed


@dataclass
class DistState:
    """This process's place in a (possibly one-process) run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: Any = None
    initialised_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup_distributed(device: str = "auto") -> DistState:
    """Join the process group when started by ``torchrun`` (``WORLD_SIZE`` > 1): NCCL on GPUs, gloo on CPUs."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if world > 1:
        here = False
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
            here = True
        if cuda:
            torch.cuda.set_device(local_rank)
            dev = torch.device("cuda", local_rank)
        else:
            dev = torch.device("cpu")
        return DistState(dist.get_rank(), dist.get_world_size(), local_rank, dev, here)
    dev = torch.device("cuda" if cuda else "cpu") if device == "auto" else torch.device(device)
    return DistState(0, 1, 0, dev, False)


def shard_model(model: Any, bf16: bool) -> None:
    """FSDP2: ``fully_shard`` every decoder layer and vision block (the classes HF lists in
    ``_no_split_modules``), then the root; bf16 parameters in compute, float32 gradient reduction."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw = {"mp_policy": mp} if mp is not None else {}
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard (_no_split_modules is empty)")
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)


# ---------------------------------------------------------------------------------------------- data


def samples_from_runs(cfg: TrainConfig, run_dirs: Sequence[str | Path], proc: Processing | None = None) -> SampleSet:
    """The training samples of ``run_dirs`` (oldest first) for ``cfg.algorithm``.

    Runs of model policies are taken as recorded; runs of the scripted (or any non-model) policy become
    demonstrations first (:func:`train.demos.demonstration_records`, in ``cfg.agent``'s protocol).
    """
    from engine.store import read_records
    from train.demos import demonstration_records

    proc = proc or Processing.load(cfg.model_dir)
    resize = {"factor": proc.vision.factor, "min_pixels": proc.vision.min_pixels, "max_pixels": proc.vision.max_pixels}
    iterations: list[tuple[str | Path, list[dict[str, Any]]]] = []
    for run_dir in run_dirs:
        records = read_records(run_dir)
        model_run = any(step.get("messages") for r in records for step in r.get("steps") or [])
        if not model_run:
            records = demonstration_records(run_dir, cfg.agent, only_success=False, resize=resize)
        iterations.append((run_dir, records))
    return samples_from_iterations(cfg, iterations, proc)


def samples_from_iterations(cfg: TrainConfig, iterations: Sequence[tuple[str | Path, Sequence[dict[str, Any]]]],
                            proc: Processing) -> SampleSet:
    """The training samples of the records of several iterations (``(run_dir, records)``, oldest first).

    - ``fbc``: :func:`train.algorithms.fbc_select` over the iterations (successful trajectories, page-changing
      steps, the last ``iterations_back`` iterations with recency weights, ``n_samples`` drawn);
    - ``grpo``: :func:`train.algorithms.grpo_advantages` per iteration (groups: the trajectories of one task);
      steps of groups without reward variance are left out.
    """
    from train.algorithms import assign_advantages, chosen_selector, fbc_select, grpo_advantages
    from train.samples import samples_from_records

    out = SampleSet()
    if cfg.algorithm == "fbc":
        chosen = fbc_select([records for _, records in iterations], cfg.iterations_back, cfg.recency,
                            cfg.n_samples, cfg.seed, cfg.recency_weighting, cfg.recency_bias_power)
        select = chosen_selector(chosen, cfg.loss_weight)
        for index, (run_dir, records) in enumerate(iterations):
            samples_from_records(proc, records, run_dir, index, select=select,
                                 use_recorded_tokens=cfg.use_recorded_tokens, out=out)
        return out
    for index, (run_dir, records) in enumerate(iterations):
        result = grpo_advantages(records, cfg.normaliser, cfg.k)
        for task_id, why in result.skipped.items():
            out.skipped[f"group skipped ({why.split(':')[0]})"] += 1
            log.debug("grpo: %s: task %s skipped: %s", run_dir, task_id, why)
        run_set = samples_from_records(proc, records, run_dir, index, use_recorded_tokens=cfg.use_recorded_tokens)
        out.skipped.update(run_set.skipped)
        out.prompts_checked += run_set.prompts_checked
        out.samples.extend(assign_advantages(run_set.samples, result))
    return out


def plan_steps(lengths: Sequence[int], cfg: TrainConfig, world: int, epoch: int) -> list[list[list[int]]]:
    """One epoch's optimizer steps: each a list of ``world * grad_accum`` micro-batches (sample indices), rank
    ``r`` taking micro-batches ``r, r + world, ...``. The last step is filled from the epoch's first
    micro-batches when the ranks would otherwise disagree on the number of micro-batches (every rank must run
    the same collectives); one process keeps a short last step as it is."""
    micro = bucket_batches(lengths, cfg.batch_size, window=cfg.bucket_window, max_tokens=cfg.max_tokens,
                           shuffle=cfg.shuffle, seed=cfg.seed + epoch)
    per_step = world * cfg.grad_accum
    steps = [micro[i:i + per_step] for i in range(0, len(micro), per_step)]
    if world > 1 and steps and len(steps[-1]) < per_step:
        need = per_step - len(steps[-1])
        filler = [micro[i % len(micro)] for i in range(need)]
        steps[-1] = steps[-1] + filler
    return steps


# ---------------------------------------------------------------------------------------------- trainer


class Trainer:
    """One training iteration over a fixed set of samples (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, samples: SampleSet | Sequence[Sample], *, model: Any = None,
                 processing: Processing | None = None) -> None:
        import torch

        self.cfg = cfg
        self.samples: list[Sample] = list(samples.samples if isinstance(samples, SampleSet) else samples)
        if not self.samples:
            raise ValueError("no training samples")
        self.dist = setup_distributed(cfg.device)
        self.device = self.dist.device
        if cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        torch.manual_seed(cfg.seed)
        self.proc = processing or Processing.load(cfg.model_dir)
        self.model = model if model is not None else load_model(cfg.model_dir, torch.float32, cfg.attn_implementation)
        self.class_name = type(self.model).__name__
        self.bf16 = self._want_bf16()
        from train.samples import model_wants_mm_token_types

        self.collate = Collator.for_processing(self.proc, mm_token_types=model_wants_mm_token_types(self.model))
        if cfg.gradient_checkpointing:
            set_checkpointing(self.model, True)
        self.model.to(self.device)
        self.sharded = False
        if self.dist.distributed:
            shard_model(self.model, self.bf16)
            self.sharded = True
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]  # no weight decay on norms and biases
        no_decay = [p for p in params if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps)
        self.lengths = [len(s) for s in self.samples]
        self.steps_per_epoch = len(plan_steps(self.lengths, cfg, self.dist.world, 0))
        self.total_steps = cfg.max_steps or cfg.epochs * self.steps_per_epoch
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps)
        self.prox: list[list[float]] | None = None
        self.out_dir = Path(cfg.output_dir)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []

    # ------------------------------------------------------------------ settings

    def _want_bf16(self) -> bool:
        import torch

        if self.cfg.bf16 is False:
            return False
        supported = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        if self.cfg.bf16 is True and not supported and self.device.type != "cpu":
            raise ValueError("bf16 = true but this device does not support bfloat16")
        # bf16 = true on a CPU: autocast works there (slowly); "auto" uses it on capable GPUs only.
        return supported or (self.cfg.bf16 is True and self.device.type == "cpu")

    def _autocast(self) -> Any:
        import torch

        if not self.bf16 or self.sharded:  # FSDP's mixed-precision policy casts instead
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    @property
    def save_dtype(self) -> Any:
        import torch

        if self.cfg.save_dtype == "auto":
            return torch.bfloat16 if self.bf16 else torch.float32
        return getattr(torch, self.cfg.save_dtype)

    # ------------------------------------------------------------------ GRPO's proximal log-probs

    def compute_proximal(self) -> None:
        """``logp_prox`` of every sample's target tokens under the current weights (no grad). Ranks split the work
        and share the results."""
        import torch
        import torch.distributed as dist

        world, rank = self.dist.world, self.dist.rank
        batches = bucket_batches(self.lengths, self.cfg.batch_size, window=self.cfg.bucket_window,
                                 max_tokens=self.cfg.max_tokens, shuffle=False)
        mine = batches[rank::world]
        rounds = -(-len(batches) // world)
        mine = mine + [batches[0]] * (rounds - len(mine))  # equal forward counts on every rank (FSDP)
        prox: dict[int, list[float]] = {}
        self.model.eval()
        with torch.no_grad():
            for idx in mine:
                batch = self.collate([self.samples[i] for i in idx])
                with self._autocast():
                    logp, _, rows, _ = label_logprobs(self.model, batch, self.device)
                logp, rows = logp.float().cpu(), rows.cpu()
                for r, i in enumerate(idx):
                    prox[i] = logp[rows == r].tolist()
        self.model.train()
        if world > 1:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, prox)
            for part in gathered:
                prox.update(part)
        self.prox = [prox[i] for i in range(len(self.samples))]

    # ------------------------------------------------------------------ one step

    def _denominator(self, micro: list[list[int]]) -> float:
        """The whole step's token count (all ranks): weighted target tokens (fbc) or target tokens, the loss mask,
        kept or dropped (grpo: AReaL's normalisation, see decoupled_ppo_loss)."""
        idx = [i for mb in micro for i in mb]
        if self.cfg.algorithm == "fbc":
            total = sum(self.samples[i].weight * len(self.samples[i].target_ids) for i in idx)
        else:
            total = sum(len(self.samples[i].target_ids) for i in idx)
        return max(float(total), 1e-8)

    def micro_loss(self, idx: list[int], denominator: float) -> tuple[Any, dict[str, float]]:
        """Forward one micro-batch; its share of the step's loss (a sum over its tokens / ``denominator``)."""
        import torch

        from train.algorithms import decoupled_ppo_loss

        batch = self.collate([self.samples[i] for i in idx])
        with self._autocast():
            logp, targets, rows, logits = label_logprobs(self.model, batch, self.device)
        n = logp.shape[0]
        stats: dict[str, float] = {"tokens": float(batch["attention_mask"].sum()), "target_tokens": float(n),
                                   "samples": float(len(idx))}
        rewards = batch["rewards"]
        stats["reward_sum"] = float(torch.nan_to_num(rewards, nan=0.0).sum())
        stats["reward_n"] = float((~torch.isnan(rewards)).sum())
        if self.cfg.algorithm == "fbc":
            weights = batch["weights"].to(self.device)[rows]
            loss = -(weights * logp).sum() / denominator
            with torch.no_grad():
                stats["correct"] = float((logits.argmax(-1) == targets).sum())
                stats["nll_sum"] = float(-logp.detach().sum())
            return loss, stats
        assert self.prox is not None
        prox = torch.tensor([x for i in idx for x in self.prox[i]], dtype=torch.float32, device=self.device)
        behave_parts = []
        for i in idx:
            s = self.samples[i]
            behave_parts.extend(s.behaviour_logprobs if s.behaviour_logprobs is not None else self.prox[i])
        behave = torch.tensor(behave_parts, dtype=torch.float32, device=self.device)
        adv = batch["advantages"].to(self.device)[rows]
        mask = torch.ones(n, dtype=torch.bool, device=self.device)
        mean, ppo = decoupled_ppo_loss(logp, prox, behave, adv, mask, clip=self.cfg.clip,
                                       dual_clip=self.cfg.dual_clip, is_cap=self.cfg.is_cap)
        kept = ppo["kept_tokens"]
        loss = mean * n / denominator  # back to a sum over this micro-batch's loss-mask tokens
        stats.update(kept_tokens=kept, clip_sum=ppo["clip_frac"] * kept, dual_sum=ppo["dual_clip_frac"] * kept,
                     dropped=float(n - kept), is_w_sum=(ppo["mean_is_weight"] * kept) if kept else 0.0,
                     ratio_sum=(ppo["mean_ratio"] * kept) if kept else 0.0,
                     adv_sum=float(batch["advantages"].sum()), nll_sum=float(-logp.detach().sum()))
        return loss, stats

    def optimizer_step(self, micro: list[list[int]]) -> dict[str, float]:
        """Run one optimizer step over the step's micro-batches (this rank's share); return its statistics
        summed over ranks."""
        import torch
        import torch.distributed as dist

        denominator = self._denominator(micro)
        mine = micro[self.dist.rank::self.dist.world]
        totals: dict[str, float] = {}
        loss_sum = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for idx in mine:
            loss, stats = self.micro_loss(idx, denominator)
            # FSDP averages gradients over ranks; each rank's loss is already its share of the global sum.
            (loss * self.dist.world).backward()
            loss_sum += float(loss.detach())
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
        totals["loss"] = loss_sum
        lr = self.optimizer.param_groups[0]["lr"]  # the LR this step used (the scheduler moves on below)
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        if self.dist.distributed:
            keys = sorted(totals)
            t = torch.tensor([totals[k] for k in keys], dtype=torch.float64)
            dist.all_reduce(t)
            totals = dict(zip(keys, t.tolist(), strict=True))
        totals["grad_norm"] = grad_norm
        totals["lr"] = lr
        return totals

    def loss_on(self, micro: list[list[int]]) -> float:
        """The loss of a step's micro-batches under the current weights, without an update (no grad)."""
        import torch

        denominator = self._denominator(micro)
        total = 0.0
        with torch.no_grad():
            for idx in micro[self.dist.rank::self.dist.world]:
                total += float(self.micro_loss(idx, denominator)[0])
        return total

    def _clip(self) -> float:
        import torch

        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------ the loop

    def metrics(self, step: int, epoch: int, totals: dict[str, float], step_s: float, elapsed: float) -> dict[str, Any]:
        tokens = totals.get("tokens", 0.0)
        target = max(totals.get("target_tokens", 0.0), 1.0)
        m: dict[str, Any] = {
            "step": step, "epoch": epoch, "loss": totals["loss"], "lr": totals.get("lr", math.nan),
            "grad_norm": totals["grad_norm"], "tokens": int(tokens),
            "target_tokens": int(totals.get("target_tokens", 0)),
            "samples": int(totals.get("samples", 0)), "tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
            "step_s": step_s, "elapsed_s": elapsed, "nll": totals.get("nll_sum", 0.0) / target,
            "reward": totals["reward_sum"] / totals["reward_n"] if totals.get("reward_n") else math.nan,
        }
        if self.cfg.algorithm == "fbc":
            m["token_acc"] = totals.get("correct", 0.0) / target
        else:
            kept = totals.get("kept_tokens", 0.0)
            m.update(kept_tokens=int(kept), dropped_frac=totals.get("dropped", 0.0) / target,
                     clip_frac=totals.get("clip_sum", 0.0) / kept if kept else 0.0,
                     dual_clip_frac=totals.get("dual_sum", 0.0) / kept if kept else 0.0,
                     mean_is_weight=totals.get("is_w_sum", 0.0) / kept if kept else math.nan,
                     mean_ratio=totals.get("ratio_sum", 0.0) / kept if kept else math.nan,
                     mean_advantage=totals.get("adv_sum", 0.0) / max(totals.get("samples", 0.0), 1.0))
        return m

    def run(self) -> TrainResult:
        """Train ``total_steps`` optimizer steps; log, save, plot (rank 0)."""
        main = self.dist.is_main
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.metrics_path.write_text("")
            (self.out_dir / "train_config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        if self.cfg.algorithm == "grpo":
            self.compute_proximal()
        writer = _tensorboard(self.out_dir / "tensorboard") if main and self.cfg.tensorboard else None
        progress = _progress(main and self.cfg.progress)
        task = progress.add_task("training", total=self.total_steps, loss=math.nan) if progress else None
        start = time.perf_counter()
        all_tokens = 0.0
        step = 0
        final_loss = math.nan
        try:
            if progress:
                progress.start()
            for epoch, micro in self._steps():
                t0 = time.perf_counter()
                totals = self.optimizer_step(micro)
                if self.device.type == "cuda":
                    import torch

                    torch.cuda.synchronize(self.device)
                step += 1
                step_s = time.perf_counter() - t0
                all_tokens += totals.get("tokens", 0.0)
                m = self.metrics(step, epoch, totals, step_s, time.perf_counter() - start)
                self.history.append(m)
                final_loss = m["loss"]
                if main and (step % self.cfg.log_every == 0 or step == self.total_steps):
                    with open(self.metrics_path, "a") as f:
                        f.write(json.dumps(m, allow_nan=True) + "\n")
                    if writer is not None:
                        for k, v in m.items():
                            if k not in ("step", "epoch") and isinstance(v, (int, float)) and math.isfinite(v):
                                writer.add_scalar(f"train/{k}", v, step)
                if progress and task is not None:
                    progress.update(task, advance=1, loss=m["loss"])
                if self.cfg.save_every and step % self.cfg.save_every == 0 and step < self.total_steps:
                    self.save(self.out_dir / f"checkpoint-{step}")
        finally:
            if progress:
                progress.stop()
            if writer is not None:
                writer.close()
        elapsed = time.perf_counter() - start
        final = self.save(self.out_dir / "final")
        if main and self.cfg.plots:
            plot_curves(self.history, self.out_dir)
        result = TrainResult(final if main else None, step, all_tokens / elapsed if elapsed > 0 else 0.0,
                             final_loss, self.metrics_path, len(self.samples), elapsed, list(self.checkpoints),
                             self.history)
        if main:
            summary = {k: v for k, v in result.__dict__.items() if k != "history"}
            (self.out_dir / "train_result.json").write_text(json.dumps(summary, default=str, indent=2) + "\n")
        return result

    def _steps(self) -> Iterator[tuple[int, list[list[int]]]]:
        done, epoch = 0, 0
        while done < self.total_steps:
            for micro in plan_steps(self.lengths, self.cfg, self.dist.world, epoch):
                if done >= self.total_steps:
                    return
                yield epoch, micro
                done += 1
            epoch += 1

    # ------------------------------------------------------------------ checkpoints

    def save(self, path: Path) -> Path:
        """A Hugging Face checkpoint at ``path`` (rank 0 writes; every rank takes part in gathering)."""
        import torch
        import torch.distributed as dist

        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            state = self.model.state_dict()
        if self.dist.is_main:
            dtype = self.save_dtype
            state = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
                     for k, v in state.items()}
            path.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(path, state_dict=state, safe_serialization=True)
            config_path = path / "config.json"
            config = json.loads(config_path.read_text())
            config["architectures"] = [self.class_name]  # not FSDP's wrapper class
            for key in ("dtype", "torch_dtype"):
                if key in config:
                    config[key] = str(dtype).removeprefix("torch.")
            config_path.write_text(json.dumps(config, indent=2) + "\n")
            copy_processor_files(self.cfg.model_dir, path)
            self.checkpoints.append(path)
        if self.dist.distributed:
            dist.barrier()
        del state
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return path

    def close(self) -> None:
        """Leave the process group if this trainer joined it."""
        import torch.distributed as dist

        if self.dist.initialised_here and dist.is_initialized():
            dist.destroy_process_group()


def train(config: TrainConfig, samples: SampleSet | Sequence[Sample]) -> TrainResult:
    """Train ``config.model_dir`` on ``samples`` with ``config.algorithm``; see the module docstring."""
    trainer = Trainer(config, samples)
    try:
        return trainer.run()
    finally:
        trainer.close()


# ---------------------------------------------------------------------------------------------- outputs


def _tensorboard(path: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the tensorboard package is optional
        return None
    return SummaryWriter(str(path))


def _progress(enabled: bool) -> Any:
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn())


def plot_curves(history: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``loss.png`` (loss and, for FBC, token accuracy) and ``reward.png`` (mean reward of the step's samples)."""
    if not history:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no plots")
        return []
    steps = [m["step"] for m in history]
    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [m["loss"] for m in history], label="loss")
    if "token_acc" in history[0]:
        ax2 = ax.twinx()
        ax2.plot(steps, [m["token_acc"] for m in history], color="tab:orange", label="token accuracy")
        ax2.set_ylabel("token accuracy")
        ax2.set_ylim(0, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training loss")
    fig.tight_layout()
    fig.savefig(out_dir / "loss.png", dpi=100)
    plt.close(fig)
    written.append(out_dir / "loss.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [m["reward"] for m in history], label="reward")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_title("reward")
    fig.tight_layout()
    fig.savefig(out_dir / "reward.png", dpi=100)
    plt.close(fig)
    written.append(out_dir / "reward.png")
    return written
