"""The Qwen-VL web agent as a :class:`Policy`: prompt and context window in, parsed action out.

The protocol is the same for every model backend; only ``LanguageModel.generate`` differs. A reply
that cannot be used becomes a recorded ``wait`` with the parse error kept, never an exception.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from engine._imgcodec import QWEN2_VL, QWEN3_VL
from engine.agent.context import build_messages
from engine.agent.coords import CoordFrame, element_centres, parse_action
from engine.agent.prompts import AgentConfig, system_prompt
from policy.base import Policy, PolicyReply, PolicyRequest, StepView
from policy.model import ChatRequest, LanguageModel, SamplingParams


class AgentPolicy(Policy):
    """Drives a :class:`LanguageModel` with the web-agent protocol."""

    def __init__(self, model: LanguageModel, cfg: AgentConfig | None = None,
                 sampling: SamplingParams | None = None) -> None:
        self.model = model
        self.cfg = cfg or AgentConfig()
        self.sampling = sampling or SamplingParams()
        self.name = model.name
        self.som = self.cfg.som
        self.history_frames = self.cfg.window
        self.templates = self.cfg.templates()
        self._systems: dict[tuple[int, int], str] = {}
        self._resize = self._resize_params()

    def _resize_params(self) -> dict[str, int]:
        """smart_resize parameters: the agent config's, else the model's own, else the family's defaults."""
        preset = self.model.resize or (QWEN3_VL if self.cfg.coords == "grid" else QWEN2_VL)
        return {"factor": self.cfg.resize_factor or preset["factor"],
                "min_pixels": self.cfg.min_pixels or preset["min_pixels"],
                "max_pixels": self.cfg.max_pixels or preset["max_pixels"]}

    def coord_frame(self, view: StepView) -> CoordFrame:
        """How the model's coordinates map to this observation's viewport."""
        if self.cfg.coords == "grid":
            return CoordFrame.grid(view.width, view.height, **self._resize)
        return CoordFrame.pixels(view.width, view.height, **self._resize)

    def system(self, frame: CoordFrame) -> str:
        """The system prompt for a viewport (it names the screen size in pixels mode)."""
        key = (frame.resized_width or frame.width, frame.resized_height or frame.height)
        if key not in self._systems:
            self._systems[key] = system_prompt(self.cfg, self.templates, *key)
        return self._systems[key]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model.model_name, "agent": asdict(self.cfg),
                "sampling": self.sampling.to_dict(), "resize": self._resize}

    async def start(self) -> None:
        await self.model.start()
        self._resize = self._resize_params()  # the model may know its image processor only now
        self._systems.clear()

    async def close(self) -> None:
        await self.model.close()

    async def act(self, request: PolicyRequest) -> PolicyReply:
        view = request.observation
        frame = self.coord_frame(view)
        messages, images = build_messages(self.cfg, self.templates, self.system(frame), request.task,
                                          request.history, view)
        gen = await self.model.generate(ChatRequest(f"{request.episode_id}/{request.step}", messages, images,
                                                    self.sampling))
        elements = element_centres(view.elements) if self.som else None
        action, info = parse_action(gen.text, frame, elements)
        parsed = info["reply"]
        details: dict[str, Any] = {
            "action_text": parsed.action_text if parsed else None,
            "memory": parsed.memory if parsed else None,
            "progress": parsed.progress if parsed else None,
            "intention": parsed.intention if parsed else None,
            "tool_call": info["call"],
            "warnings": info["warnings"] + info["skipped"],
            "frames": info["frames"],
            "finish_reason": gen.finish_reason,
            "prompt_tokens": gen.prompt_tokens,
            "prompt_sha256": gen.prompt_sha256,
            "model_timings_ms": gen.timings_ms,
        }
        return PolicyReply(action, text=gen.text, thought=parsed.thought if parsed else None,
                           parse_error=info["error"], token_ids=gen.token_ids, logprobs=gen.logprobs,
                           policy_version=gen.policy_version if gen.policy_version is not None
                           else request.policy_version, messages=messages, details=details)
