"""Training samples rebuilt from run directories: the exact token sequence the policy saw at each step.

A model-policy step records the chat it was given (``messages``, without the system message, which the
episode stores once as ``system_prompt``), the raw reply, and, when the backend returned them, the generated
``token_ids`` and their ``logprobs``. :func:`build_samples` rebuilds each step's prompt with the model's own
tokenizer and chat template through :func:`policy.prompting.prompt_ids`, the function the ``hf`` backend
builds its prompts with (inside :func:`policy.prompting.build_prompt_ids`), so the rebuilt ids are those the
policy saw; the backend's recorded ``prompt_sha256`` proves it step by step. The step's ``parsed.logprobs_of``
(with ``logprobs_temperature`` / ``logprobs_sampling``) says under which distribution the log-probs were taken;
:func:`train.behaviour.behaviour_temperature` turns it into the sample's temperature and comparability.

Images are not decoded while samples are built: an image's token count follows from its JPEG header alone
(:func:`policy.prompting.image_token_count`). Pixels are decoded by :class:`Collator`, through
the project's codec (:func:`policy.vision.preprocess_jpeg`), only when a batch is built, so a data set of
thousands of steps holds token ids, never screenshots.

Batch layout (:class:`Collator`; ``B`` samples, ``T`` the longest sequence, right padding):

==========================  ==================  ==========================================================
key                         shape, dtype        meaning
==========================  ==================  ==========================================================
``input_ids``               (B, T) int64        prompt + target, then ``pad_token_id``
``attention_mask``          (B, T) int64        1 on real tokens
``labels``                  (B, T) int64        the target ids at their own positions, -100 elsewhere
                                                (prompt, history, padding); HF convention: the model
                                                shifts, i.e. logits[:, t - 1] predict labels[:, t]
``loss_mask``               (B, T) bool         ``labels != -100``
``behaviour_logprobs``      (B, T) float32      the recorded log-prob of labels[:, t] at position t (0 where
                                                masked or unknown; see ``has_behaviour``)
``has_behaviour``           (B,) bool           the sample has recorded log-probs
``logprobs_temperature``    (B,) float32        :attr:`Sample.logprobs_temperature`: GRPO divides the row's
                                                logits by it, so that its log-probs are the recorded ones'
``logprobs_vision_masked``  (B,) bool           :attr:`Sample.logprobs_vision_masked`: whether the row's
                                                log-probs leave the vision placeholders out
``advantages``              (B,) float32        :attr:`Sample.advantage` (filled by the algorithm)
``weights``                 (B,) float32        :attr:`Sample.weight` (loss weights, e.g. FBC's recency)
``rewards``                 (B,) float32        the episode's reward (NaN when there is none)
``policy_version``          (B,) int64          the policy version that generated the step
``pixel_values``            (P, patch_dim) f32  every image of the batch, in order (absent without images)
``image_grid_thw``          (n_images, 3) int64
``mm_token_type_ids``       (B, T) int32        1 on image tokens; only with ``mm_token_types=True`` (models
                                                whose forward takes it: transformers >= 5)
==========================  ==================  ==========================================================
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import _imgcodec as codec
from engine.agent.model_api import image_refs
from engine.store.records import EpisodeRecord, StepRecord, reward_value
from engine.store.run_dir import FrameRefError, frame_file, read_records
from policy.prompting import (
    image_token_count,
    image_token_id_of,
    load_tokenizer,
    prompt_ids,
    prompt_sha256,
)
from policy.vision import ProcessedImage, VisionConfig, preprocess_jpeg, stack_images, vision_config_of
from policy.vision_tokens import vision_token_ids
from train.behaviour import behaviour_temperature
from train.model_inputs import IGNORE_INDEX

#: Decides whether a step becomes a sample and with which loss weight: ``select(run_index, record, step)``
#: returns None to leave it out, or the weight.
StepSelector = Callable[[int, EpisodeRecord, StepRecord], float | None]


@dataclass(slots=True)
class Processing:
    """What rebuilding needs from a model directory: tokenizer (with chat template) and image settings."""

    tokenizer: Any
    vision: VisionConfig | None  # None: a text-only model (no image processor), whose prompts have no images
    image_token_id: int
    pad_token_id: int
    end_token_id: int  # the end-of-turn token appended to a reply that has no recorded token ids
    vision_token_ids: frozenset[int] = frozenset()  # placeholders a reply never holds (see policy.vision_tokens)

    @classmethod
    def load(cls, processor_dir: str | Path) -> Processing:
        """Read the tokenizer, ``config.json`` (when present) and ``preprocessor_config.json`` of a model dir."""
        tokenizer = load_tokenizer(processor_dir)
        config = None
        if (Path(processor_dir) / "config.json").exists():
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(processor_dir)
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(end, int) or end < 0 or end == tokenizer.unk_token_id:
            end = tokenizer.eos_token_id  # a template without ChatML turns
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else end
        image_token_id = image_token_id_of(tokenizer, config)
        vision = frozenset(vision_token_ids(config)) | {image_token_id} if config is not None else {image_token_id}
        return cls(tokenizer, vision_config_of(processor_dir), image_token_id, int(pad), int(end),
                   frozenset(vision))

    def image_tokens(self, jpeg_header: bytes) -> int:
        """How many ``<|image_pad|>`` tokens a JPEG takes, from its header alone (no decoding)."""
        if self.vision is None:
            raise ValueError("a text-only model reads no images: this step's prompt has one")
        width, height = codec.jpeg_size(jpeg_header)
        return image_token_count(width, height, self.vision)


@dataclass(slots=True)
class Sample:
    """One step as a training sequence: ``input_ids = prompt + target``; the loss goes on the target only."""

    input_ids: list[int]
    prompt_len: int
    images: list[str]  # absolute paths of the step's JPEGs, in prompt order (decoded only by the collator)
    image_tokens: list[int]  # pads per image, as expanded in input_ids (checked against the decoded image)
    run_dir: str
    run_index: int  # the run's index in build_samples' run_dirs (its iteration, newest last)
    episode_id: str
    task_id: str
    step: int
    reward: float | None  # the episode's reward
    policy_version: int
    behaviour_logprobs: list[float] | None  # one per target token (the recorded ones), None when not recorded
    prompt_sha256: str  # of the rebuilt prompt
    recorded_prompt_sha256: str | None  # what the backend recorded (None: not recorded)
    target_source: str  # "recorded" (the generated token ids) | "reply" (the reply tokenized + end of turn)
    advantage: float = 0.0  # filled by the algorithm (GRPO) before batching
    weight: float = 1.0  # loss weight (e.g. FBC's recency weight)
    page_changed: bool | None = None
    # Under which distribution the step's log-probs were recorded (train.behaviour): the step's parsed.logprobs_of,
    # the temperature T of log_softmax(logits / T) (1.0: the model's own), and whether the trainer reproduces
    # them (False unless the record says so: GRPO refuses behaviour log-probs it cannot compare with its own).
    logprobs_of: str | None = None
    logprobs_temperature: float = 1.0
    logprobs_comparable: bool = False
    # Whether that distribution left the vision placeholders out (parsed.logprobs_vision_masked; the hf backend's
    # way, and what records from before that field were compared with).
    logprobs_vision_masked: bool = True

    @property
    def target_ids(self) -> list[int]:
        return self.input_ids[self.prompt_len:]

    @property
    def labels(self) -> list[int]:
        """``input_ids`` with the prompt (system, history, current observation) masked by -100."""
        return [IGNORE_INDEX] * self.prompt_len + self.target_ids

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class SampleSet:
    """The samples of :func:`build_samples` and what was left out, by reason."""

    samples: list[Sample] = field(default_factory=list)
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    prompts_checked: int = 0  # steps whose recorded prompt_sha256 was compared with the rebuild

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)


class SampleError(ValueError):
    """A step cannot be rebuilt faithfully (raised with ``on_mismatch="raise"``)."""


def full_prompt(record: EpisodeRecord, step: StepRecord) -> list[dict[str, Any]]:
    """The chat the model got at ``step``: the episode's system message, then the step's messages (a step
    whose system message differed from the episode's kept it in its messages)."""
    messages = list(step["messages"])
    system = record.get("system_prompt")
    if system is not None and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _header(path: Path) -> bytes:
    # The header holds the size; screenshots from Chromium carry no big metadata, but read it all if the
    # first 64 KiB are not enough.
    with open(path, "rb") as f:
        head = f.read(65536)
        try:
            codec.jpeg_size(head)
            return head
        except codec.ImgCodecError:
            return head + f.read()


def _decodes_to(tokenizer: Any, token_ids: Sequence[int], reply: str) -> bool:
    """The recorded tokens are the reply "modulo special tokens": the backends decode with special tokens
    skipped (hf), or keep them (some servers). A reply cut inside a character (at ``max_tokens``) ends in bytes
    that decode to U+FFFD, which a server's incremental detokenizer withholds from its text (vLLM's)."""
    decoded = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    if decoded == reply or (decoded.startswith(reply) and not decoded[len(reply):].strip("\ufffd")):
        return True
    return tokenizer.decode(list(token_ids), skip_special_tokens=False) == reply


def step_sample(proc: Processing, record: EpisodeRecord, step: StepRecord, run_dir: Path, run_index: int,
                *, use_recorded_tokens: bool = True) -> Sample:
    """Rebuild one step (which must have ``messages``); raises :class:`SampleError` when it cannot be
    rebuilt faithfully (prompt fingerprint or target mismatch, a missing image)."""
    messages = full_prompt(record, step)
    refs = image_refs(messages)
    try:
        paths = [frame_file(run_dir, ref) for ref in refs]
        counts = [proc.image_tokens(_header(p)) for p in paths]
    except (OSError, FrameRefError, codec.ImgCodecError) as exc:
        raise SampleError(f"image: {exc}") from exc
    ids = prompt_ids(proc.tokenizer, messages, counts, proc.image_token_id)
    sha = prompt_sha256(ids)
    recorded_sha = (step.get("parsed") or {}).get("prompt_sha256")
    if recorded_sha is not None and recorded_sha != sha:
        raise SampleError("prompt mismatch: the rebuilt prompt's sha256 differs from the recorded one "
                          "(another tokenizer, template or image processor than the policy's?)")
    reply = step.get("reply") or ""
    token_ids = step.get("token_ids")
    logprobs = step.get("logprobs")
    if use_recorded_tokens and token_ids:
        if not _decodes_to(proc.tokenizer, token_ids, reply):
            raise SampleError("target mismatch: the recorded token_ids do not decode to the recorded reply")
        target = [int(t) for t in token_ids]
        if not proc.vision_token_ids.isdisjoint(target):
            raise SampleError("vision token in reply: the reply holds a vision placeholder the model would take "
                              "for part of an image")
        source = "recorded"
        if logprobs is not None and len(logprobs) != len(target):
            raise SampleError(f"logprobs mismatch: {len(logprobs)} log-probs for {len(target)} tokens")
    else:
        target = list(proc.tokenizer(reply, add_special_tokens=False)["input_ids"]) + [proc.end_token_id]
        source, logprobs = "reply", None
    reward = reward_value(record)
    parsed = step.get("parsed") or {}
    temperature, comparable = behaviour_temperature(parsed)
    return Sample(
        input_ids=ids + target, prompt_len=len(ids), images=[str(p) for p in paths], image_tokens=counts,
        run_dir=str(run_dir), run_index=run_index, episode_id=str(record.get("episode_id")),
        task_id=str((record.get("task") or {}).get("task_id")), step=int(step.get("step", 0)),
        reward=None if reward is None else float(reward), policy_version=int(step.get("policy_version") or 0),
        behaviour_logprobs=[float(x) for x in logprobs] if logprobs is not None else None,
        prompt_sha256=sha, recorded_prompt_sha256=recorded_sha, target_source=source,
        page_changed=step.get("page_changed"), logprobs_of=parsed.get("logprobs_of"),
        logprobs_temperature=temperature, logprobs_comparable=comparable,
        logprobs_vision_masked=parsed.get("logprobs_vision_masked") is not False)


def samples_from_records(proc: Processing, records: Iterable[EpisodeRecord], run_dir: str | Path,
                         run_index: int = 0, *, select: StepSelector | None = None, on_mismatch: str = "skip",
                         use_recorded_tokens: bool = True, out: SampleSet | None = None) -> SampleSet:
    """The samples of ``records`` (one run's, or demonstration records of :mod:`train.demos`) into ``out``.

    ``on_mismatch``: ``"skip"`` (count the reason in ``SampleSet.skipped``) or ``"raise"`` (SampleError).
    """
    if on_mismatch not in ("skip", "raise"):
        raise ValueError("on_mismatch must be 'skip' or 'raise'")
    out = out if out is not None else SampleSet()
    run_dir = Path(run_dir).resolve()
    for record in records:
        for step in record.get("steps") or []:
            if not step.get("messages"):
                out.skipped["no messages (not a model policy's step)"] += 1
                continue
            weight = 1.0
            if select is not None:
                chosen = select(run_index, record, step)
                if chosen is None:
                    out.skipped["not selected"] += 1
                    continue
                weight = float(chosen)
            try:
                sample = step_sample(proc, record, step, run_dir, run_index, use_recorded_tokens=use_recorded_tokens)
            except SampleError as exc:
                if on_mismatch == "raise":
                    raise SampleError(f"{run_dir}: {record.get('episode_id')} step {step.get('step')}: {exc}") from exc
                out.skipped[str(exc).split(":")[0]] += 1
                continue
            out.prompts_checked += sample.recorded_prompt_sha256 is not None
            sample.weight = weight
            out.samples.append(sample)
    return out


def build_samples(run_dirs: Sequence[str | Path] | str | Path, processor_dir: str | Path | Processing, *,
                  select: StepSelector | None = None, on_mismatch: str = "skip",
                  use_recorded_tokens: bool = True) -> SampleSet:
    """Every model-policy step of ``run_dirs`` (oldest first: a sample's ``run_index`` is its run's position)
    as a :class:`Sample`, rebuilt with the tokenizer and image processor of ``processor_dir`` (the policy's
    model directory).

    Steps without messages (scripted or random policies) are skipped and counted; convert those with
    :mod:`train.demos` first. ``select`` picks steps and sets their loss weights.
    """
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    proc = processor_dir if isinstance(processor_dir, Processing) else Processing.load(processor_dir)
    out = SampleSet()
    for index, run_dir in enumerate(run_dirs):
        samples_from_records(proc, read_records(run_dir), run_dir, index, select=select, on_mismatch=on_mismatch,
                             use_recorded_tokens=use_recorded_tokens, out=out)
    return out


# ---------------------------------------------------------------------------------------------- batching


def bucket_batches(lengths: Sequence[int], batch_size: int, *, window: int = 64, max_tokens: int | None = None,
                   shuffle: bool = True, seed: int = 0) -> list[list[int]]:
    """Batches of sample indices with similar lengths (less padding), still in random order.

    The indices are shuffled, cut into windows of ``window * batch_size``, each window sorted by length and
    cut into batches of at most ``batch_size`` samples (and, with ``max_tokens``, at most that many padded
    tokens: ``len(batch) * longest <= max_tokens``, one sample always fits); the batches are then shuffled.
    Sorting only within a window keeps the order random across the data set.
    """
    if batch_size < 1 or window < 1:
        raise ValueError("batch_size and window must be >= 1")
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)
    batches: list[list[int]] = []
    span = window * batch_size
    for start in range(0, len(order), span):
        chunk = sorted(order[start:start + span], key=lambda i: lengths[i])
        batch: list[int] = []
        longest = 0
        for i in chunk:
            longer = max(longest, lengths[i])
            too_long = max_tokens is not None and (len(batch) + 1) * longer > max_tokens
            if batch and (len(batch) >= batch_size or too_long):
                batches.append(batch)
                batch, longer = [], lengths[i]
            batch.append(i)
            longest = longer
        if batch:
            batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def _load_image(path: str, vision: VisionConfig) -> ProcessedImage:
    # Looked up at call time (not bound at import) so that tests can count the decodes.
    return preprocess_jpeg(Path(path).read_bytes(), vision)


@dataclass
class Collator:
    """Samples -> one batch of torch tensors (see the module docstring for the layout); decodes the images."""

    vision: VisionConfig | None
    pad_token_id: int
    image_token_id: int
    mm_token_types: bool = False

    @classmethod
    def for_processing(cls, proc: Processing, mm_token_types: bool = False) -> Collator:
        return cls(proc.vision, proc.pad_token_id, proc.image_token_id, mm_token_types)

    def __call__(self, samples: Sequence[Sample]) -> dict[str, Any]:
        import torch

        if not samples:
            raise ValueError("an empty batch")
        width = max(len(s) for s in samples)
        n = len(samples)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((n, width), dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        behaviour = torch.zeros((n, width), dtype=torch.float32)
        images: list[ProcessedImage] = []
        for row, s in enumerate(samples):
            length = len(s)
            input_ids[row, :length] = torch.tensor(s.input_ids, dtype=torch.long)
            attention_mask[row, :length] = 1
            labels[row, s.prompt_len:length] = torch.tensor(s.target_ids, dtype=torch.long)
            if s.behaviour_logprobs is not None:
                behaviour[row, s.prompt_len:length] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            for path, expected in zip(s.images, s.image_tokens, strict=True):
                if self.vision is None:
                    raise ValueError(f"{path}: a text-only model reads no images")
                image = _load_image(path, self.vision)
                if image.num_tokens != expected:  # the file changed since the sample was built
                    raise ValueError(f"{path}: {image.num_tokens} image tokens, the sample expanded {expected}")
                images.append(image)
        batch: dict[str, Any] = {
            "input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "loss_mask": labels != IGNORE_INDEX, "behaviour_logprobs": behaviour,
            "has_behaviour": torch.tensor([s.behaviour_logprobs is not None for s in samples], dtype=torch.bool),
            "logprobs_temperature": torch.tensor([s.logprobs_temperature for s in samples], dtype=torch.float32),
            "logprobs_vision_masked": torch.tensor([s.logprobs_vision_masked for s in samples], dtype=torch.bool),
            "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
            "weights": torch.tensor([s.weight for s in samples], dtype=torch.float32),
            "rewards": torch.tensor([math.nan if s.reward is None else s.reward for s in samples], dtype=torch.float32),
            "policy_version": torch.tensor([s.policy_version for s in samples], dtype=torch.long),
        }
        if images:
            pixel_values, grid_thw = stack_images(images)
            batch["pixel_values"] = torch.from_numpy(pixel_values)
            batch["image_grid_thw"] = torch.from_numpy(np.ascontiguousarray(grid_thw))
        if self.mm_token_types:
            batch["mm_token_type_ids"] = (input_ids == self.image_token_id).to(torch.int32)
        return batch


def _torch_iterable_base() -> type:
    try:
        from torch.utils.data import IterableDataset

        return IterableDataset
    except ImportError:  # pragma: no cover - torch is a training dependency
        return object


class BatchStream(_torch_iterable_base()):  # type: ignore[misc]
    """An iterable of collated batches over samples, bucketed by length; images decoded batch by batch.

    Usable directly (``for batch in stream``) or as a ``torch.utils.data.IterableDataset`` with
    ``DataLoader(stream, batch_size=None, num_workers=k)``: each worker takes every k-th batch, so the
    decoding runs in the workers. Each iteration reshuffles with ``seed + epoch`` (call :meth:`set_epoch`).
    """

    def __init__(self, samples: Sequence[Sample], collator: Collator, batch_size: int, *, window: int = 64,
                 max_tokens: int | None = None, shuffle: bool = True, seed: int = 0) -> None:
        self.samples = list(samples)
        self.collator = collator
        self.batch_size, self.window, self.max_tokens = batch_size, window, max_tokens
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self) -> list[list[int]]:
        """The batches (sample indices) of the current epoch."""
        return bucket_batches([len(s) for s in self.samples], self.batch_size, window=self.window,
                              max_tokens=self.max_tokens, shuffle=self.shuffle, seed=self.seed + self.epoch)

    def __len__(self) -> int:
        return len(self.plan())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker, workers = 0, 1
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            if info is not None:
                worker, workers = info.id, info.num_workers
        except ImportError:  # pragma: no cover
            pass
        for i, batch in enumerate(self.plan()):
            if i % workers == worker:
                yield self.collator([self.samples[j] for j in batch])
