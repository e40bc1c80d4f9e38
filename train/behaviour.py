"""Which recorded (behaviour) log-probs the trainer can compare with its own, and at which temperature.

GRPO's decoupled PPO weighs each token by ``exp(logp_prox - logp_behave)``: the proximal log-prob, which the
trainer computes, and the behaviour one, which the rollout recorded, must be taken under the same distribution,
or the weights are wrong from the first update on. A step's ``parsed.logprobs_of`` says which distribution the
backend reported (:data:`engine.agent.model_api.LOGPROBS_KINDS`):

==================  ====================================================  ===========  ============
``logprobs_of``     needs                                                 temperature  comparable
==================  ====================================================  ===========  ============
``"model"``         nothing                                               1            yes
``"temperature"``   ``parsed.logprobs_temperature`` > 0, finite           that one     yes
``"sampler"``       ``parsed.logprobs_sampling`` with temperature 1 and   1            only then
                    no top-k / top-p / min-p
anything else       (None: the backend does not say)                      1            no
==================  ====================================================  ===========  ============

The trainer divides a sample's logits by its temperature before the log-softmax (GRPO), so that ``logp_theta``,
``logp_prox`` and ``logp_behave`` are under one distribution; :func:`require_comparable` refuses a GRPO run over
behaviour log-probs it cannot reproduce.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class RecordedStep(Protocol):
    """What :func:`require_comparable` reads of a training sample (:class:`train.samples.Sample`)."""

    @property
    def run_dir(self) -> str: ...
    @property
    def episode_id(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def behaviour_logprobs(self) -> list[float] | None: ...
    @property
    def logprobs_of(self) -> str | None: ...
    @property
    def logprobs_comparable(self) -> bool: ...


#: What to do about log-probs the trainer cannot reproduce (part of :func:`require_comparable`'s message).
REMEDY = ("serve the policy with raw log-probs (vLLM's default, --logprobs-mode raw_logprobs; SGLang with "
          "SGLANG_RETURN_ORIGINAL_LOGPROB=1) or with SGLang's default tempered log-probs, with the backend saying "
          "which in Generation.logprobs_of; or sample at temperature 1 without top-k/top-p")


def _positive(value: Any) -> float | None:
    """``value`` as a positive finite float, else None (a bool is not a temperature)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def untruncated_at_one(sampling: Any) -> bool:
    """Whether recorded sampling settings (``temperature``, ``top_p``, ``top_k``, maybe ``min_p``) sampled from
    the model's own distribution: temperature 1 and nothing cut off. Missing settings prove nothing: False."""
    if not isinstance(sampling, Mapping) or _positive(sampling.get("temperature")) != 1.0:
        return False
    top_p, top_k, min_p = sampling.get("top_p"), sampling.get("top_k"), sampling.get("min_p")
    if top_p is not None and not (isinstance(top_p, (int, float)) and top_p >= 1.0):
        return False
    # vLLM and SGLang take -1 (and 0) for "no top-k".
    if top_k is not None and not (isinstance(top_k, int) and top_k <= 0):
        return False
    return min_p is None or (isinstance(min_p, (int, float)) and min_p <= 0)


def behaviour_temperature(parsed: Mapping[str, Any] | None) -> tuple[float, bool]:
    """``(temperature, comparable)`` of a step's recorded log-probs, from the step's ``parsed`` details (see the
    module docstring's table). The temperature is 1.0 whenever the log-probs are not comparable."""
    parsed = parsed or {}
    kind = parsed.get("logprobs_of")
    if kind == "model":
        return 1.0, True
    if kind == "temperature":
        temperature = _positive(parsed.get("logprobs_temperature"))
        return (temperature, True) if temperature is not None else (1.0, False)
    if kind == "sampler":
        return 1.0, untruncated_at_one(parsed.get("logprobs_sampling"))
    return 1.0, False


def _why(kind: str | None) -> str:
    if kind == "temperature":
        return "'temperature' without a positive logprobs_temperature"
    if kind == "sampler":
        return "'sampler' after temperature or truncation, or without the sampling settings"
    if kind is None:
        return "None (the backend does not say)"
    return f"{kind!r} (unknown)"


def require_comparable(samples: Sequence[RecordedStep]) -> None:
    """Raise ``ValueError`` when any sample has recorded behaviour log-probs the trainer cannot reproduce (GRPO
    would weigh its tokens wrongly); the message says how many, which ``logprobs_of`` values, and what to do.
    Samples without recorded log-probs are fine: the trainer uses the proximal ones for them."""
    bad = [s for s in samples if s.behaviour_logprobs is not None and not s.logprobs_comparable]
    if not bad:
        return
    kinds = collections.Counter(s.logprobs_of for s in bad)
    found = ", ".join(f"{_why(kind)}: {n}" for kind, n in sorted(kinds.items(), key=lambda kv: str(kv[0])))
    first = bad[0]
    raise ValueError(
        f"grpo: {len(bad)} of {len(samples)} samples have behaviour log-probs the trainer cannot reproduce, so "
        f"their importance weights exp(logp_prox - logp_behave) would be wrong (logprobs_of found: {found}; "
        f"e.g. {first.run_dir} episode {first.episode_id} step {first.step}). To train on them: {REMEDY}.")
