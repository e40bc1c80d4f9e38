"""The policy interface: given the current observation of one rollout, choose one action.

Every backend (scripted, random, model servers, in-process models) implements :class:`Policy`.
Policies are called concurrently from many rollouts; an implementation batches or caps them as it
needs. Oracle access to the page (:class:`PageProbe`) exists only for scripted policies.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from browserpool.protocol import AXNode, DOMNode
from engine.agent.actions import AgentAction
from engine.agent.tree_text import tree_text
from engine.tasks.schema import Task


class PageProbe(Protocol):
    """Read-only questions about the live page (for scripted demonstrations, never for models)."""

    async def locate(self, selector: str) -> dict[str, Any]: ...


@dataclass(slots=True)
class StepView:
    """What a policy sees of one past or current step."""

    url: str
    title: str
    jpeg: bytes | memoryview | None
    width: int
    height: int
    settled: bool
    frame: str | None = None  # the stored screenshot (its path in the run directory): the image REF
    elements: list[list[Any]] | None = None  # Set-of-Marks: [id, tag, text, x, y, w, h] in CSS px
    elements_text: str | None = None  # the element list as the prompt shows it (built once, on first use)
    axtree: list[AXNode] | None = None  # the page's accessibility tree (policies with ``axtree``)
    axtree_cut: bool = False  # the worker's node cap cut it
    axtree_text: str | None = None  # the tree as the prompt shows it (built once, on first use: tree_text)
    dom: list[DOMNode] | None = None  # the page's elements with boxes and visibility (policies with ``dom``)
    # Filled in once the step's decision is made (history only):
    action: AgentAction | None = None
    action_text: str | None = None  # the model's own one-line description of the action, if any
    reply: str | None = None  # the raw model reply
    page_changed: bool | None = None


def view_tree_text(view: StepView) -> str:
    """The view's accessibility tree as text (:func:`engine.agent.tree_text.tree_text`, with the DOM snapshot's
    marks when the view has one), built once per view."""
    if view.axtree_text is None:
        view.axtree_text = tree_text(view.axtree or [], view.axtree_cut, view.dom)
    return view.axtree_text


@dataclass(slots=True)
class PolicyRequest:
    """One decision: the task, the step index, the current observation and the history so far."""

    episode_id: str
    task: Task
    step: int
    observation: StepView
    history: list[StepView] = field(default_factory=list)  # shared with the rollout: read, never modify
    page: PageProbe | None = None
    policy_version: int = 0


@dataclass(slots=True)
class PolicyReply:
    """A policy's answer: the action plus what training and debugging need."""

    action: AgentAction
    text: str = ""  # the raw reply (model output), or a description for non-model policies
    thought: str | None = None
    parse_error: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: int | None = None  # the weights' version that produced it; None: the one asked for
    messages: list[dict[str, Any]] | None = None  # the exact chat the model was given (images by REF)
    details: dict[str, Any] | None = None  # parsed fields, coordinate frames, generation facts


def training_fields(reply: PolicyReply) -> tuple[list[int] | None, list[float] | None, int | None]:
    """A reply's sampled token ids, their log-probabilities and its weights' version as plain Python values (each
    may also come as a tuple, a numpy array or a torch tensor, or as a numpy integer), so that its record holds
    numbers, which its reader accepts: written as text, a numpy value made the whole run unreadable. TypeError for
    a value of another type (the reply's texts and action included), ValueError for two lists of different
    lengths."""
    if not isinstance(reply.action, AgentAction):
        raise TypeError(f"the action must be an AgentAction, not {type(reply.action).__name__}")
    for name in ("text", "thought", "parse_error"):
        value = getattr(reply, name)
        if not (isinstance(value, str) or (value is None and name != "text")):
            raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    ids = _plain_list(reply.token_ids, "token_ids", _an_int)
    lps = _plain_list(reply.logprobs, "logprobs", _a_float)
    if ids is not None and lps is not None and len(ids) != len(lps):
        raise ValueError(f"{len(ids)} token_ids but {len(lps)} logprobs: one log-probability per token")
    version = None if reply.policy_version is None else _an_int(reply.policy_version, "policy_version")
    return ids, lps, version


def _plain_list(values: Any, what: str, item: Callable[[Any, str], Any]) -> list[Any] | None:
    if values is None:
        return None
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):  # numpy arrays, torch tensors
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{what} must be a list of numbers, not {type(values).__name__}")
    return [item(v, what) for v in values]


def _an_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what}: {value!r} is not an integer")
    try:
        return operator.index(value)  # ints, numpy integers, 0-d integer tensors
    except TypeError:
        raise TypeError(f"{what}: {type(value).__name__} {str(value)[:40]!r} is not an integer") from None


def _a_float(value: Any, what: str) -> float:
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"{what}: {type(value).__name__} {str(value)[:40]!r} is not a number")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{what}: NaN is not a log-probability")
    return number


class PolicyError(RuntimeError):
    """The policy could not produce a reply (a server down, a model crash)."""


class Policy:
    """Base class of all policies."""

    name = "policy"
    wants_page_probe = False  # True only for oracle policies (scripted demonstrations)
    som = False  # True: observations carry Set-of-Marks elements and screenshots with the marks drawn
    axtree = False  # True: observations carry the page's accessibility tree (StepView.axtree)
    dom = False  # True: observations carry the page's DOM snapshot (StepView.dom)
    history_frames = 0  # how many past screenshots act() reads; older ones are dropped from memory
    reads_pixels = True  # False: act() never reads StepView.jpeg (it is None), so the engine copies no screenshot

    async def start(self) -> None:
        """Acquire resources (connections, models). Called once before the first act()."""

    async def act(self, request: PolicyRequest) -> PolicyReply:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about this policy."""
        return {"name": self.name}

    async def end_episode(self, episode_id: str) -> None:
        """Forget per-episode state."""

    async def close(self) -> None:
        """Release resources."""
