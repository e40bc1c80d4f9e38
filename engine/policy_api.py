"""The policy interface: given the current observation of one rollout, choose one action.

Every backend (scripted, random, model servers, in-process models) implements :class:`Policy`.
Policies are called concurrently from many rollouts; an implementation batches or caps them as it
needs. Oracle access to the page (:class:`PageProbe`) exists only for scripted policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.actions import AgentAction
from engine.tasks import Task


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
    # Filled in once the step's decision is made (history only):
    action: AgentAction | None = None
    action_text: str | None = None  # the model's own one-line description of the action, if any
    reply: str | None = None  # the raw model reply
    page_changed: bool | None = None


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


class PolicyError(RuntimeError):
    """The policy could not produce a reply (a server down, a model crash)."""


class Policy:
    """Base class of all policies."""

    name = "policy"
    wants_page_probe = False  # True only for oracle policies (scripted demonstrations)
    som = False  # True: observations carry Set-of-Marks elements and screenshots with the marks drawn
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
