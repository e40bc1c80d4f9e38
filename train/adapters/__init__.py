"""Adapters that let RL trainers drive the engine's step-level environment (:class:`engine.clients.env.AsyncWebEnv`).

- :mod:`train.adapters.trl`: :class:`~train.adapters.trl.WebEnvironment`, an environment for TRL's
  ``GRPOTrainer(environment_factory=...)``: the model acts through a ``computer_use`` tool and sees each new
  screenshot in the tool's answer.
- :mod:`train.adapters.verl`: ``WebAgentLoop``, a veRL agent loop (``AgentLoopBase``) that runs one episode and
  returns one sample per step.
- :mod:`train.adapters.areal`: :class:`~train.adapters.areal.WebAgentWorkflow`, an AReaL agent workflow that runs
  one episode through AReaL's OpenAI-compatible proxy.

Each module imports its framework only where it needs it. This module holds what they share: a process-wide engine
core on its own event-loop thread (:func:`shared_core`), the bridge that runs an environment's coroutines on that
loop from another loop (:func:`on_core`), the engine's chats (images by REF, JPEG bytes beside them) with
``PIL.Image`` parts for Hugging Face processors (:func:`chat_with_pil_images`), and :func:`run_episode`, the step
loop the veRL and AReaL adapters share: reset, then for each step the chat ``run`` would give the model
(``env.messages()``), the model's reply, and ``env.step(reply)`` until the episode ends.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.metadata
import os
import re
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from engine import _imgcodec as codec
from engine.clients.env import AsyncWebEnv
from engine.clients.gym_env import CoreThread
from engine.core.config import RunConfig
from engine.store.records import reward_value
from engine.tasks.loading import load_tasks
from engine.tasks.schema import Task

T = TypeVar("T")

__all__ = [
    "Episode", "FrameworkVersion", "Reply", "Step", "chat_with_pil_images", "close_shared_cores", "jpeg_to_pil",
    "on_core", "run_episode", "shared_core", "shared_tasks",
]

# --- the frameworks' versions -----------------------------------------------------------------------------


def _release(version: str) -> tuple[int, ...]:
    """``"0.9.1rc2"`` as ``(0, 9, 1)``: the release numbers a version is compared by."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


@dataclass(frozen=True, slots=True)
class FrameworkVersion:
    """The versions of a trainer framework an adapter supports: ``tested`` (pinned by the framework's extra in
    ``pyproject.toml``; its tests run against it) and ``minimum`` (the oldest with what the adapter uses)."""

    name: str  # as its users write it ("veRL")
    distribution: str  # as pip knows it ("verl")
    tested: str
    minimum: str

    def check(self) -> str | None:
        """The installed version (None when the framework is not installed). An older one than ``minimum``
        raises ImportError (the adapter would fail inside the framework); a newer minor series than ``tested``
        warns (untested)."""
        try:
            installed = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
        extra = f"pip install 'webgym-engine[{self.distribution}]' installs {self.tested}, the version tested"
        if _release(installed) < _release(self.minimum):
            raise ImportError(f"the {self.name} adapter needs {self.name} >= {self.minimum}, found {installed}; "
                              f"{extra}")
        if _release(installed)[:2] > _release(self.tested)[:2]:
            warnings.warn(f"{self.name} {installed} is newer than the {self.name} adapter was tested with "
                          f"({self.tested}); {extra}", stacklevel=3)
        return installed


# --- the engine core --------------------------------------------------------------------------------------

_cores: dict[tuple[Any, ...], CoreThread] = {}
_tasks: dict[tuple[str, str | None], list[Task]] = {}
_lock = threading.Lock()


def shared_core(cfg: RunConfig | Mapping[str, Any] | None = None, *, serve_sites: bool = True,
                base_url: str | None = None) -> CoreThread:
    """The process's engine core for ``cfg`` (a :class:`RunConfig` or its fields as a mapping), started on first
    use on its own event-loop thread and closed when the process exits. A trainer that builds its agent loops or
    workflows from configuration (veRL instantiates one agent loop per trajectory) gets the same core, hence one
    browser pool, in every one of them. ``serve_sites``: serve the bundled sites (their URL is the core's
    ``base_url``); ``base_url``: where the task sites are served instead."""
    if cfg is None:
        cfg = RunConfig()
    elif not isinstance(cfg, RunConfig):
        cfg = RunConfig(**dict(cfg))
    # The process id is part of the key: a process forked from one with a core (AReaL's subproc workers) has a
    # copy of it whose thread did not survive the fork, so it starts its own.
    key = (os.getpid(), repr(cfg), serve_sites, base_url)
    with _lock:
        core = _cores.get(key)
        if core is None or not core.running:
            core = _cores[key] = CoreThread(cfg, base_url=base_url, serve_sites=serve_sites and base_url is None)
            if len(_cores) == 1:
                atexit.register(close_shared_cores)
        return core


def shared_tasks(task_file: str | Path, base_url: str | None) -> list[Task]:
    """The tasks of ``task_file`` with ``{SITES}`` set to ``base_url``, loaded once per process."""
    key = (str(task_file), base_url)
    with _lock:
        if key not in _tasks:
            _tasks[key] = load_tasks(task_file, base_url)
        return _tasks[key]


def close_shared_cores() -> None:
    """Close every core :func:`shared_core` started in this process (episodes still running end with their
    records)."""
    with _lock:
        cores = [core for key, core in _cores.items() if key[0] == os.getpid()]
        _cores.clear()
    for core in cores:
        core.close()


async def on_core(core: CoreThread, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the core's event loop from any other running loop (a trainer's own)."""
    return await core.run(coro)


# --- chats ------------------------------------------------------------------------------------------------


def jpeg_to_pil(data: bytes) -> Any:
    """A screenshot's JPEG bytes as an RGB ``PIL.Image`` (decoded by the engine's C codec)."""
    from PIL import Image

    return Image.fromarray(codec.decode(data))


def _swap_images(messages: Sequence[Mapping[str, Any]],
                 part: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [part(p["image"]) if p.get("type") == "image" else dict(p) for p in content]
        out.append({**message, "content": content})
    return out


def chat_with_pil_images(messages: Sequence[Mapping[str, Any]],
                         images: Mapping[str, bytes]) -> tuple[list[dict[str, Any]], list[Any]]:
    """An engine chat (image parts by REF) with each image part carrying its ``PIL.Image`` instead
    (``{"type": "image", "image": <PIL.Image>}``, the shape Hugging Face processors take), and the images in
    order of appearance."""
    pil = {ref: jpeg_to_pil(jpeg) for ref, jpeg in images.items()}
    ordered: list[Any] = []

    def part(ref: str) -> dict[str, Any]:
        ordered.append(pil[ref])
        return {"type": "image", "image": pil[ref]}

    return _swap_images(messages, part), ordered


# --- the step loop ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Reply:
    """A model's reply to one step: its text and, where the generator has them, its tokens."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # whatever the generator wants to keep with the step


@dataclass(slots=True)
class Step:
    """One decision: the chat the model was given (images by REF), their JPEG bytes, its reply, what the env
    said back (the step's ``info``) and the step's reward (the episode's reward on its last step, else 0)."""

    messages: list[dict[str, Any]]
    images: dict[str, bytes]
    reply: Reply
    info: dict[str, Any]
    reward: float = 0.0


@dataclass(slots=True)
class Episode:
    """A finished episode: its steps, its reward, how it ended and its record (as in ``episodes.jsonl``)."""

    task_id: str
    steps: list[Step]
    reward: float
    terminated: bool
    truncated: bool
    record: dict[str, Any] | None

    @property
    def episode_id(self) -> str | None:
        return (self.record or {}).get("episode_id")


async def _settled_reward(reward: float, info: dict[str, Any], timeout_s: float | None) -> float:
    """The episode's reward, after the judge's verdict where the episode waits for one (on the core's loop)."""
    verdict = info.get("verdict")
    if verdict is None:
        return reward
    async with asyncio.timeout(timeout_s):
        merged = await verdict
    return float((reward_value(merged) if merged else None) or 0.0)


async def run_episode(core: CoreThread, env: AsyncWebEnv, task: Task | str,
                      generate: Callable[[list[dict[str, Any]], dict[str, bytes]], Awaitable[Reply]], *,
                      policy_version: int | None = None, verdict_timeout_s: float | None = 600.0) -> Episode:
    """Run one episode of ``task`` on ``env`` (an environment of ``core``'s engine) from the caller's event loop.

    Each step: the chat ``run`` would give the model now (``env.messages()``: system prompt, context window,
    screenshots by REF, and their JPEG bytes) goes to ``generate``, whose :class:`Reply` text steps the
    environment (its tokens and log-probabilities are recorded with the step). Ends when the episode does: the
    last step's reward is the episode's, the judge's verdict awaited where there is one. An episode that ends
    with an error (a lost browser worker, a time cap) raises :class:`engine.clients.env.EpisodeError`."""

    async def reset() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, bytes]]:
        _, info = await env.reset(task)
        chat, images = env.messages() if not info.get("ended") else ([], {})
        return info, chat, images

    async def step(reply: Reply) -> tuple[float, bool, bool, dict[str, Any], list[dict[str, Any]], dict[str, bytes]]:
        _, reward, terminated, truncated, info = await env.step(
            reply.text, token_ids=reply.token_ids, logprobs=reply.logprobs, policy_version=policy_version)
        if terminated or truncated:
            reward = await _settled_reward(reward, info, verdict_timeout_s)
            info.pop("verdict", None)
            return reward, terminated, truncated, info, [], {}
        chat, images = env.messages()
        return reward, terminated, truncated, info, chat, images

    info, chat, images = await on_core(core, reset())
    task_id = task if isinstance(task, str) else task.task_id
    steps: list[Step] = []
    if info.get("ended"):  # the page ended the episode as it opened
        record = info.get("record") or {}
        reward = float((record.get("reward") or {}).get("value") or 0.0)
        return Episode(task_id, steps, reward, True, False, record)
    while True:
        reply = await generate(chat, images)
        step_chat, step_images = chat, images
        reward, terminated, truncated, info, chat, images = await on_core(core, step(reply))
        steps.append(Step(step_chat, step_images, reply, info, reward))
        if terminated or truncated:
            return Episode(task_id, steps, reward, terminated, truncated, info.get("record"))
