"""The Qwen-VL web agent as a :class:`Policy`: a language model driven by :class:`AgentProtocol`.

The protocol is the same for every model backend; only ``LanguageModel.generate`` differs. A reply
that cannot be used becomes a recorded ``wait`` with the parse error kept, never an exception.
"""

from __future__ import annotations

from typing import Any

from engine.agent.coords import CoordFrame
from engine.agent.model_api import ChatRequest, Generation, LanguageModel, SamplingParams
from engine.agent.policy_api import Policy, PolicyError, PolicyReply, PolicyRequest, StepView
from engine.agent.prompts import AgentConfig
from engine.agent.protocol import AgentProtocol


def generation_details(gen: Generation, sampling: SamplingParams) -> dict[str, Any]:
    """The generation facts a step records in ``parsed``, besides the parsed reply.

    ``logprobs_of`` always (None: the backend does not say), and with it ``logprobs_vision_masked`` (whether the
    vision placeholders were out of that distribution). Training needs the sampling settings to take log-probs
    under the same distribution: ``logprobs_temperature`` (the request's temperature) with ``"temperature"``
    log-probs, and ``logprobs_sampling`` (temperature, top_p, top_k) with ``"sampler"`` ones, which the trainer
    can reproduce only when nothing was truncated.
    """
    details: dict[str, Any] = {"finish_reason": gen.finish_reason, "prompt_tokens": gen.prompt_tokens,
                               "prompt_sha256": gen.prompt_sha256, "model_timings_ms": gen.timings_ms,
                               "logprobs_of": gen.logprobs_of}
    if gen.logprobs_of is not None:
        details["logprobs_vision_masked"] = gen.logprobs_vision_masked
    if gen.logprobs_of == "temperature":
        details["logprobs_temperature"] = sampling.temperature
    elif gen.logprobs_of == "sampler":
        details["logprobs_sampling"] = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                        "top_k": sampling.top_k}
    return details


class AgentPolicy(Policy):
    """Drives a :class:`LanguageModel` with the web-agent protocol."""

    def __init__(self, model: LanguageModel, cfg: AgentConfig | None = None,
                 sampling: SamplingParams | None = None) -> None:
        self.model = model
        self.protocol = AgentProtocol(cfg, model.resize)
        self.cfg = self.protocol.cfg
        self.sampling = sampling or SamplingParams()
        self.name = model.name
        self.som = self.cfg.som
        self.axtree = self.cfg.axtree
        self.dom = self.cfg.dom
        self.reads_pixels = self.cfg.screenshot  # a text-only agent's prompt has no image: none is copied for it
        self.history_frames = self.cfg.window
        self.templates = self.protocol.templates

    def coord_frame(self, view: StepView) -> CoordFrame:
        """How the model's coordinates map to this observation's viewport."""
        return self.protocol.coord_frame(view)

    def system(self, frame: CoordFrame) -> str:
        """The system prompt for a viewport (it names the screen size in pixels mode)."""
        return self.protocol.system(frame)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model.model_name, **self.protocol.describe(),
                "sampling": self.sampling.to_dict()}

    async def start(self) -> None:
        await self.model.start()
        self.protocol.use_model_resize(self.model.resize)  # the model may know its image processor only now

    async def close(self) -> None:
        await self.model.close()

    async def act(self, request: PolicyRequest) -> PolicyReply:
        view = request.observation
        messages, images = self.protocol.messages(request.task, request.history, view)
        request_id = f"{request.episode_id}/{request.step}"
        gen = await self.model.generate(ChatRequest(request_id, messages, images,
                                                    self.sampling.for_request(request_id)))
        if not isinstance(gen.text, str):  # a backend's bug: the parser and the record take text only
            raise PolicyError(f"the model backend {self.model.name!r} returned a {type(gen.text).__name__} "
                              "as the reply's text")
        read = self.protocol.read(gen.text, view)
        details = {**read.details, **generation_details(gen, self.sampling)}
        return PolicyReply(read.action, text=gen.text, thought=read.thought, parse_error=read.parse_error,
                           token_ids=gen.token_ids, logprobs=gen.logprobs,
                           policy_version=gen.policy_version if gen.policy_version is not None
                           else request.policy_version, messages=messages, details=details)
