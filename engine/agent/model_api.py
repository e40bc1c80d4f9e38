"""The language-model interface every model backend implements (openai, hf, vllm, simulated).

A backend turns one chat (messages with images) into one reply. It knows nothing about web agents:
the agent protocol (prompt, context window, parsing) lives in :mod:`policy.agent_policy` and is the
same for every backend.

Messages are plain JSON-able dicts in the chat-completions shape. Text parts are
``{"type": "text", "text": ...}``; image parts are ``{"type": "image", "image": REF}`` where ``REF``
names a stored screenshot (its path inside the run directory). The bytes of every referenced JPEG
travel alongside in :attr:`ChatRequest.images`, so a backend never reads the disk on the hot path and
the recorded messages stay small.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args


@dataclass(slots=True)
class SamplingParams:
    """Sampling settings (the original's defaults: temperature 1.0, top_p 0.99)."""

    temperature: float = 1.0
    top_p: float = 0.99
    top_k: int | None = None
    max_tokens: int = 512
    seed: int | None = None
    logprobs: bool = True  # ask for the sampled tokens' log-probabilities where the backend can

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_tokens": self.max_tokens, "seed": self.seed, "logprobs": self.logprobs}

    def for_request(self, request_id: str) -> SamplingParams:
        """These settings for one request: with a seed, the request's own seed, derived from that seed and
        ``request_id`` (the same pair, the same seed). vLLM and SGLang seed each request on its own: one seed
        shared by every request gives every request the same random draws, and an evaluation at temperature 1
        then samples all its episodes alike (all of them submit, or none)."""
        if self.seed is None:
            return self
        digest = hashlib.blake2b(f"{self.seed}/{request_id}".encode(), digest_size=4).digest()
        return dataclasses.replace(self, seed=int.from_bytes(digest, "big") >> 1)  # 31 bits: any server's range


@dataclass(slots=True)
class ChatRequest:
    """One generation request."""

    request_id: str
    messages: list[dict[str, Any]]
    images: Mapping[str, bytes]  # image REF -> JPEG bytes, for every image part in ``messages``
    sampling: SamplingParams = field(default_factory=SamplingParams)


#: What :attr:`Generation.logprobs_of` may say, i.e. under which distribution a reply's log-probs were taken
#: (``logits`` the model's scores at a step, with the vision placeholders left out where
#: :attr:`Generation.logprobs_vision_masked` says so, ``T`` the request's :attr:`SamplingParams.temperature`):
#:
#: - ``"model"``: ``log_softmax(logits)``, the model's own distribution before temperature, top-k and top-p
#:   (the ``hf`` backend's default, vLLM's ``raw_logprobs``, SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``);
#: - ``"temperature"``: ``log_softmax(logits / T)``, before top-k and top-p (SGLang's default);
#: - ``"sampler"``: the distribution sampled from, after truncation as well (vLLM's ``processed_logprobs``):
#:   the trainer can reproduce it only when ``T`` is 1 and there was no top-k or top-p.
#:
#: ``None`` (the backend does not say) is not one of them: such log-probs cannot be compared with the trainer's.
LogprobsKind = Literal["model", "temperature", "sampler"]
LOGPROBS_KINDS: tuple[LogprobsKind, ...] = get_args(LogprobsKind)

#: The kinds the trainer reproduces whatever the sampling settings (with ``T`` known for ``"temperature"``).
COMPARABLE_LOGPROBS: tuple[str, ...] = ("model", "temperature")


@dataclass(slots=True)
class Generation:
    """One reply, with what training needs where the backend provides it.

    ``logprobs_of`` names the distribution of ``logprobs`` (see :data:`LOGPROBS_KINDS`); it stays a plain
    string so that a backend may report what its server says as it is.
    """

    text: str
    token_ids: list[int] | None = None  # the generated tokens (not the prompt)
    logprobs: list[float] | None = None  # one per generated token (``logprobs_of`` says under which distribution)
    logprobs_of: str | None = None  # one of LOGPROBS_KINDS, or None: the backend does not say
    # Whether the vision placeholders were left out of that distribution (the hf backend never samples them; vLLM's
    # and SGLang's log-probs are over the whole vocabulary): the trainer takes each step's the same way.
    logprobs_vision_masked: bool = False
    prompt_tokens: int | None = None
    finish_reason: str | None = None  # stop | length | ...
    # sha256 of the prompt token ids as little-endian int32 (policy.prompting.prompt_sha256): training checks
    # its rebuild of the step's prompt against it
    prompt_sha256: str | None = None
    policy_version: int | None = None  # the version of the weights that generated it, when the backend knows
    timings_ms: dict[str, float] = field(default_factory=dict)


class LanguageModel:
    """Base class of the model backends. ``generate`` is called concurrently from many rollouts.

    Implementations raise :class:`engine.agent.policy_api.PolicyError` when no reply can be produced (a server
    that stays down after retries, a model that crashed); the rollout then ends with an error record.
    """

    name = "model"
    model_name = ""  # what the backend serves (a path or a served model name), for records
    # The smart_resize parameters (factor, min_pixels, max_pixels) of the model's image processor, when
    # the backend knows them after start(): the agent then maps pixel coordinates with the same sizes.
    resize: dict[str, int] | None = None

    async def start(self) -> None:
        """Acquire resources (HTTP sessions, model weights). Called once before the first generate()."""

    async def generate(self, request: ChatRequest) -> Generation:
        raise NotImplementedError

    async def close(self) -> None:
        """Release resources; pending generate() calls fail with PolicyError."""


def image_refs(messages: list[dict[str, Any]]) -> list[str]:
    """The image REFs of ``messages`` in order of appearance."""
    refs: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            refs.extend(part["image"] for part in content if part.get("type") == "image")
    return refs
