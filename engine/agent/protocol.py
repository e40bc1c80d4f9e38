"""The web-agent protocol as one object: the chat a model is given for a step, and its reply read back as
an action, with the coordinate frames of every screenshot.

:class:`policy.agent_policy.AgentPolicy` drives a language model with it, and the step-level environments
(:mod:`engine.clients.env`) use the same object to read a trainer's raw reply text and to build the messages a
trainer's own model call should see, so both paths give the model exactly what ``run`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine._imgcodec import QWEN2_VL, QWEN3_VL
from engine.agent.actions import AgentAction
from engine.agent.policy_api import StepView
from engine.tasks.schema import Task

from .context import build_messages
from .coords import CoordFrame, element_centres
from .formats import action_format
from .prompts import AgentConfig
from .tree_text import tree_ids


@dataclass(slots=True)
class ReadReply:
    """A reply read as an action: the action (``wait`` when nothing usable was found) and why."""

    action: AgentAction
    thought: str | None
    parse_error: str | None
    details: dict[str, Any]  # parsed fields, the tool call, warnings and skipped calls, coordinate frames


class AgentProtocol:
    """Prompt, context window and reply parsing of the web agents for one :class:`AgentConfig` (its action
    format: Qwen's tool calls, UI-TARS, pyautogui code; :mod:`engine.agent.formats`).

    ``resize``: the smart_resize parameters (factor, min_pixels, max_pixels) of the model's image processor;
    the config's own values win, then these, then the model family's defaults.
    """

    def __init__(self, cfg: AgentConfig | None = None, resize: dict[str, int] | None = None) -> None:
        self.cfg = cfg or AgentConfig()
        self.templates = self.cfg.templates()
        self.format = action_format(self.cfg.action_format)
        self._systems: dict[tuple[int, int], str] = {}
        self._frames: dict[tuple[int, int], CoordFrame] = {}  # by viewport: a run has one or a few
        self.resize = self._resize_params(resize)

    def _resize_params(self, model_resize: dict[str, int] | None) -> dict[str, int]:
        preset = model_resize or (QWEN3_VL if self.cfg.coords == "grid" else QWEN2_VL)
        return {"factor": self.cfg.resize_factor or preset["factor"],
                "min_pixels": self.cfg.min_pixels or preset["min_pixels"],
                "max_pixels": self.cfg.max_pixels or preset["max_pixels"]}

    def use_model_resize(self, model_resize: dict[str, int] | None) -> None:
        """Adopt the image processor's parameters a model backend learnt at start."""
        self.resize = self._resize_params(model_resize)
        self._systems.clear()
        self._frames.clear()

    @property
    def som(self) -> bool:
        return self.cfg.som

    @property
    def window(self) -> int:
        """How many past screenshots the chat shows."""
        return self.cfg.window

    def coord_frame(self, view: StepView) -> CoordFrame:
        """How the model's coordinates map to this observation's viewport."""
        key = (view.width, view.height)
        frame = self._frames.get(key)
        if frame is None:
            make = CoordFrame.grid if self.cfg.coords == "grid" else CoordFrame.pixels
            frame = self._frames[key] = make(view.width, view.height, **self.resize)
        return frame

    def system(self, frame: CoordFrame) -> str:
        """The system prompt for a viewport (it names the screen size in pixels mode)."""
        key = (frame.resized_width or frame.width, frame.resized_height or frame.height)
        if key not in self._systems:
            self._systems[key] = self.format.system_prompt(self.cfg, self.templates, *key)
        return self._systems[key]

    def messages(self, task: Task, history: Sequence[StepView],
                 current: StepView) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """The chat for one decision (system prompt, context window, summaries, ``<think>`` stripped) and the
        JPEG bytes of every image it references by REF."""
        return build_messages(self.cfg, self.templates, self.system(self.coord_frame(current)), task, history,
                              current)

    def read(self, text: str, current: StepView) -> ReadReply:
        """A model's reply to the step that observed ``current``, as an action (never raises)."""
        elements = element_centres(current.elements) if self.cfg.som else None
        tree = tree_ids(current.axtree or []) if self.cfg.axtree else None
        if tree is not None and self.cfg.som and current.elements:  # a marked element the tree left out is named too
            tree = tree | {int(e[0]) for e in current.elements}
        action, info = self.format.read(text, self.coord_frame(current), elements, tree)
        parsed = info["reply"]
        details: dict[str, Any] = {
            "action_text": parsed.action_text if parsed else None,
            "memory": parsed.memory if parsed else None,
            "progress": parsed.progress if parsed else None,
            "intention": parsed.intention if parsed else None,
            "tool_call": info["call"],
            "warnings": info["warnings"] + info["skipped"],
            "frames": info["frames"],
        }
        if parsed is not None and parsed.truncated:  # only the reply's first MAX_REPLY_CHARS were read
            details["truncated"] = True
        return ReadReply(action, parsed.thought if parsed else None, info["error"], details)

    def describe(self) -> dict[str, Any]:
        """What a run manifest records about the protocol."""
        return {"agent": asdict(self.cfg), "resize": self.resize}
