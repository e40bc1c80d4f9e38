"""The trainer: plain torch on a transformers Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), FBC or GRPO.

One process on the CPU or one GPU, or several GPUs under ``torchrun`` with FSDP2 (:mod:`train.distributed`).
This module holds the training loop and what feeds it (samples from run directories);
its pieces have their own modules: :mod:`train.logprobs` (the label log-probs every loss starts from),
:mod:`train.model_io` (loading the model, writing checkpoints), :mod:`train.plan` (micro-batches and steps),
:mod:`train.packing` (sequence packing), :mod:`train.schedule` (the LR schedule),
:mod:`train.curves` (progress bar, TensorBoard, plots) and :mod:`train.behaviour` (which recorded log-probs GRPO
can use). What one optimizer step does:

- the step's micro-batches (``grad_accum`` per process; in a distributed run the step's ``world * grad_accum``
  micro-batches are dealt to the ranks, as a ``DistributedSampler`` would, repeating from the start to fill the
  last step) are collated (:class:`train.samples.Collator`; images decoded here), run forward, and their loss
  backpropagated; bf16 autocast where the device supports it (FSDP: a bf16 mixed-precision policy instead);
- each label token's log-probability is taken from the logits in float32 (:func:`train.logprobs.label_logprobs`:
  only the positions that predict a label are projected onto the vocabulary); GRPO divides each row's logits by
  the temperature its behaviour log-probs were recorded at (:attr:`Sample.logprobs_temperature`), FBC does not;
- the loss is a sum over the step's tokens divided by the whole step's count, known before the step from the
  samples (so ``grad_accum`` micro-batches of 1 equal one batch of ``grad_accum``, and ranks add up exactly):

  - ``fbc``: weighted token-mean NLL on the target tokens, ``sum_i w_i * nll_i / sum_i w_i`` over tokens (a
    sample's weight is its :attr:`Sample.weight`, from :func:`train.algorithms.fbc_select`);
  - ``grpo``: :func:`train.algorithms.decoupled_ppo_loss` with ``logp_theta`` from the forward,
    ``logp_prox`` the model's log-probs at the start of the update (one ``no_grad`` pass over every sample
    before the first optimizer step), ``logp_behave`` the recorded behaviour log-probs (the proximal ones
    when none were recorded) and the sample's advantage (:func:`train.algorithms.grpo_advantages`); the mean
    is over every target token of the step, tokens over the importance-weight cap counting as zeros (AReaL's
    normalisation by the loss mask). All three log-probs are under one distribution: the trainer refuses (a
    ``ValueError`` when it is built) samples whose recorded log-probs it cannot reproduce
    (:func:`train.behaviour.require_comparable`);
- gradients clipped to ``max_grad_norm``, AdamW step, LR schedule step (linear warm-up, then cosine or
  constant).

Outputs in ``output_dir``: ``metrics.jsonl`` (one line per logged step: step, loss, lr, grad_norm, tokens/s
and the algorithm's statistics), ``loss.png`` / ``reward.png``, TensorBoard scalars under ``tensorboard/``
(when ``torch.utils.tensorboard`` imports), ``checkpoint-N/`` every ``save_every`` steps and ``final/``:
Hugging Face model directories (:func:`train.model_io.write_checkpoint`) that :class:`policy.hf_backend.HFModel`
and vLLM load as they are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store.records import EpisodeRecord
from policy.compiled_blocks import check_backend, set_compiled_blocks
from policy.vision import resize_of
from policy.vision_attention import set_vision_attention
from policy.vision_mlp import set_vision_mlp
from train.behaviour import require_comparable
from train.config import TrainConfig
from train.curves import plot_curves, progress_bar, tensorboard_writer
from train.distributed import setup_distributed, shard_model
from train.logprobs import label_logprobs
from train.model_io import load_model, set_checkpointing, write_checkpoint
from train.packing import batch_tokens, prepare_batch
from train.plan import micro_batches, plan_steps
from train.samples import Collator, Processing, Sample, SampleSet
from train.schedule import make_scheduler

log = logging.getLogger(__name__)

#: ``stop_at(checkpoint, step) -> bool``: whether to end the training at a checkpoint (see :func:`train`).
StopAt = Callable[[Path, int], bool]


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


# ---------------------------------------------------------------------------------------------- data


def samples_from_runs(cfg: TrainConfig, run_dirs: Sequence[str | Path], proc: Processing | None = None) -> SampleSet:
    """The training samples of ``run_dirs`` (oldest first) for ``cfg.algorithm``.

    Runs of model policies are taken as recorded; runs of the scripted (or any non-model) policy become
    demonstrations first (:func:`train.demos.demonstration_records`, in ``cfg.agent``'s protocol).
    """
    from engine.store.run_dir import read_records
    from train.demos import demonstration_records

    proc = proc or Processing.load(cfg.model_dir)
    resize = resize_of(proc.vision)
    iterations: list[tuple[str | Path, list[EpisodeRecord]]] = []
    for run_dir in run_dirs:
        records = read_records(run_dir)
        model_run = any(step.get("messages") for r in records for step in r.get("steps") or [])
        if not model_run:
            records = demonstration_records(run_dir, cfg.agent, only_success=False, resize=resize)
        iterations.append((run_dir, records))
    return samples_from_iterations(cfg, iterations, proc)


def samples_from_iterations(cfg: TrainConfig, iterations: Sequence[tuple[str | Path, Sequence[EpisodeRecord]]],
                            proc: Processing,
                            groups: Sequence[Mapping[str, Sequence[EpisodeRecord]] | None] | None = None) -> SampleSet:
    """The training samples of the records of several iterations (``(run_dir, records)``, oldest first).

    - ``fbc``: :func:`train.algorithms.fbc_select` over the iterations (successful trajectories, page-changing
      steps, the last ``iterations_back`` iterations with recency weights, ``n_samples`` drawn);
    - ``grpo``: :func:`train.algorithms.grpo_advantages` per iteration (groups: ``groups[i]``, the RL loop's
      groups of iteration ``i``, or else the trajectories of one task); steps of groups without reward variance
      are left out. ``cfg.shuffle_rewards``: the control run's shuffled rewards (seeded by ``cfg.seed``).

    Only trainable records (:func:`train.algorithms.is_trainable`) give samples; ``skipped`` counts the others by
    status.
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
        grouped = groups[index] if groups is not None else None
        result = grpo_advantages(grouped if grouped is not None else records, cfg.normaliser, cfg.k,
                                 shuffle_seed=cfg.seed * 1009 + index if cfg.shuffle_rewards else None)
        for status, n in result.excluded.items():
            out.skipped[f"not trainable ({status})"] += n
        for task_id, why in result.skipped.items():
            out.skipped[f"group skipped ({why.split(':')[0]})"] += 1
            log.debug("grpo: %s: task %s skipped: %s", run_dir, task_id, why)
        # Only the trajectories that got an advantage are rebuilt (not those of skipped groups, nor untrainable ones),
        # in the run's order.
        position = {id(r): i for i, r in enumerate(records)}
        kept = sorted((t.record for t in result.trajectories), key=lambda r: position.get(id(r), len(position)))
        run_set = samples_from_records(proc, kept, run_dir, index, use_recorded_tokens=cfg.use_recorded_tokens)
        out.skipped.update(run_set.skipped)
        out.prompts_checked += run_set.prompts_checked
        out.samples.extend(assign_advantages(run_set.samples, result))
    return out


# ---------------------------------------------------------------------------------------------- trainer


class Trainer:
    """One training iteration over a fixed set of samples (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, samples: SampleSet | Sequence[Sample], *, model: Any = None,
                 processing: Processing | None = None, stop_at: StopAt | None = None) -> None:
        import torch

        self.cfg = cfg
        self.stop_at = stop_at
        self.samples: list[Sample] = list(samples.samples if isinstance(samples, SampleSet) else samples)
        if not self.samples:
            raise ValueError("no training samples")
        if cfg.algorithm == "grpo":
            require_comparable(self.samples)  # before anything loads: a wrong importance weight is silent
        self.dist = setup_distributed(cfg.device)
        if stop_at is not None and self.dist.distributed:
            raise ValueError("stop_at (early stopping) runs in one process; not under torchrun")
        if cfg.compile_blocks != "off":  # refused before the model loads
            if self.dist.distributed:
                # FSDP2's hooks around each sharded layer would run inside the compiled blocks: not measured yet.
                raise ValueError("compile_blocks is not supported with FSDP2 (torchrun) yet; set it to off")
            check_backend(cfg.compile_backend)
        self.device = self.dist.device
        if cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        torch.manual_seed(cfg.seed)
        self.proc = processing or Processing.load(cfg.model_dir)
        if model is None:
            model = load_model(cfg.model_dir, torch.float32, cfg.attn_implementation, cfg.vision_attention)
        else:
            set_vision_attention(model, cfg.vision_attention)
        set_vision_mlp(model, cfg.vision_mlp)
        self.model = model
        self.class_name = type(self.model).__name__
        self.bf16 = self._want_bf16()
        from train.model_inputs import model_wants_mm_token_types

        self.collate = Collator.for_processing(self.proc, mm_token_types=model_wants_mm_token_types(self.model))
        if cfg.gradient_checkpointing:
            set_checkpointing(self.model, cfg.gradient_checkpointing)
        self.model.to(self.device)
        self.sharded = False
        if self.dist.distributed:
            shard_model(self.model, self.bf16)
            self.sharded = True
        set_compiled_blocks(self.model, cfg.compile_blocks, backend=cfg.compile_backend)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]  # no weight decay on norms and biases
        no_decay = [p for p in params if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps)
        self._plan(cfg)

    def _plan(self, cfg: TrainConfig) -> None:
        """The steps, schedule and outputs of a training over ``self.samples``."""
        self.lengths = [len(s) for s in self.samples]
        self.steps_per_epoch = len(plan_steps(self.lengths, cfg, self.dist.world, 0))
        self.total_steps = cfg.max_steps or cfg.epochs * self.steps_per_epoch
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps)
        self.prox: list[list[float]] | None = None
        self.out_dir = Path(cfg.output_dir)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []

    def next_iteration(self, cfg: TrainConfig, samples: SampleSet | Sequence[Sample]) -> None:
        """Train next on ``samples`` with the same model and optimizer state (the RL loop's persistent trainer, as
        an RL framework's actor keeps its weights and Adam moments from one update to the next); ``cfg`` gives
        the new output directory and seed, and the same model settings (checked)."""
        fixed = ("algorithm", "attn_implementation", "vision_attention", "vision_mlp", "compile_blocks", "device",
                 "gradient_checkpointing", "bf16")
        changed = [k for k in fixed if getattr(cfg, k) != getattr(self.cfg, k)]
        if changed:
            raise ValueError(f"next_iteration cannot change {', '.join(changed)}; start a new Trainer")
        samples = list(samples.samples if isinstance(samples, SampleSet) else samples)
        if not samples:
            raise ValueError("no training samples")
        if cfg.algorithm == "grpo":
            require_comparable(samples)
        self.cfg, self.samples = cfg, samples
        for group in self.optimizer.param_groups:  # a new scheduler starts from the configured rate
            group["lr"] = group["initial_lr"] = cfg.lr
        self._plan(cfg)

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

    def _temperature(self, batch: dict[str, Any]) -> Any:
        """The rows' temperatures for :func:`label_logprobs`: GRPO compares with the recorded log-probs, so each row
        is taken at its recording's temperature; FBC's NLL is the model's own (None: 1)."""
        return batch["logprobs_temperature"] if self.cfg.algorithm == "grpo" else None

    @property
    def save_dtype(self) -> Any:
        import torch

        if self.cfg.save_dtype == "auto":
            return torch.bfloat16 if self.bf16 else torch.float32
        return getattr(torch, self.cfg.save_dtype)

    def _batch(self, idx: list[int]) -> dict[str, Any]:
        """The forward's batch of samples ``idx``: collated (images decoded), packed when ``cfg.packing``."""
        return prepare_batch(self.collate([self.samples[i] for i in idx]), self.model, self.cfg.packing)

    # ------------------------------------------------------------------ GRPO's proximal log-probs

    def compute_proximal(self) -> None:
        """``logp_prox`` of every sample's target tokens under the current weights (no grad). Ranks split the work
        and share the results."""
        import torch
        import torch.distributed as dist

        world, rank = self.dist.world, self.dist.rank
        batches = micro_batches(self.lengths, self.cfg, shuffle=False, seed=self.cfg.seed)
        mine = batches[rank::world]
        rounds = -(-len(batches) // world)
        mine = mine + [batches[0]] * (rounds - len(mine))  # equal forward counts on every rank (FSDP)
        prox: dict[int, list[float]] = {}
        self.model.eval()
        with torch.no_grad():
            for idx in mine:
                batch = self._batch(idx)
                with self._autocast():
                    logp, _, rows, _ = label_logprobs(self.model, batch, self.device, self._temperature(batch))
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

        batch = self._batch(idx)
        with self._autocast():
            logp, targets, rows, logits = label_logprobs(self.model, batch, self.device, self._temperature(batch))
        n = logp.shape[0]
        stats: dict[str, float] = {"tokens": float(batch_tokens(batch)), "target_tokens": float(n),
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
        writer = tensorboard_writer(self.out_dir / "tensorboard") if main and self.cfg.tensorboard else None
        progress = progress_bar(main and self.cfg.progress)
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
                    path = self.save(self.out_dir / f"checkpoint-{step}")
                    if self.stop_at is not None and self.stop_at(path, step):
                        break
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
            write_checkpoint(self.model, state, path, class_name=self.class_name, dtype=self.save_dtype,
                             source_dir=self.cfg.model_dir)
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


def train(config: TrainConfig, samples: SampleSet | Sequence[Sample], *, stop_at: StopAt | None = None) -> TrainResult:
    """Train ``config.model_dir`` on ``samples`` with ``config.algorithm``; see the module docstring.

    ``stop_at(checkpoint, step)``: called after each ``save_every`` checkpoint (one process); True ends the training
    there (early stopping: the final checkpoint is then that step's weights)."""
    trainer = Trainer(config, samples, stop_at=stop_at)
    try:
        return trainer.run()
    finally:
        trainer.close()
