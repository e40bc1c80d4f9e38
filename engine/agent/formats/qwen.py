"""Qwen-VL's format: fields (Thought, Memory, Progress, Intention, Action) and one ``computer_use`` call as JSON
inside ``<tool_call>`` tags, the grammar of the original's agents (:mod:`engine.agent.parser`,
:mod:`engine.agent.coords`)."""

from __future__ import annotations

from typing import Any, ClassVar

from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame, Elements, parse_action
from engine.agent.prompts import AgentConfig, PromptTemplates, system_prompt

from .base import ActionFormat


class QwenToolCallFormat(ActionFormat):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL and the original's web agents."""

    name: ClassVar[str] = "qwen"
    families: ClassVar[str] = "Qwen2-VL, Qwen2.5-VL, Qwen3-VL (computer_use tool calls), the original's agents"

    def system_prompt(self, cfg: AgentConfig, templates: PromptTemplates, width: int, height: int) -> str:
        return system_prompt(cfg, templates, width, height)

    def read(self, text: str, frame: CoordFrame, elements: Elements | None = None,
             tree: frozenset[int] | None = None) -> tuple[AgentAction, dict[str, Any]]:
        return parse_action(text, frame, elements)
