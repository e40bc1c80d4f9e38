"""Action formats: the grammars a model family answers in, chosen by ``--action-format``
(:attr:`engine.agent.prompts.AgentConfig.action_format`). See :mod:`engine.agent.formats.base`."""

from __future__ import annotations

from engine.agent.prompts import ACTION_FORMATS

from .base import ActionFormat, CallFormat
from .browsergym import BrowserGymFormat
from .pyautogui import PyAutoGUIFormat
from .qwen import QwenToolCallFormat
from .uitars import UITarsFormat

FORMATS: dict[str, ActionFormat] = {f.name: f for f in (QwenToolCallFormat(), UITarsFormat(), PyAutoGUIFormat(),
                                                BrowserGymFormat())}
assert tuple(FORMATS) == ACTION_FORMATS  # the names AgentConfig checks (prompts.py cannot import this package)


def action_format(name: str) -> ActionFormat:
    """The format called ``name``; ValueError for an unknown one."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown action format {name!r}; expected one of {', '.join(FORMATS)}") from None


__all__ = ["FORMATS", "ActionFormat", "CallFormat", "action_format"]
