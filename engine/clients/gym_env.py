"""A synchronous ``gymnasium.Env`` over :class:`engine.clients.env.AsyncWebEnv`, for BrowserGym-style users.

The engine core runs on an event loop in a background thread (:class:`CoreThread`); every ``WebEnv`` of a
process can share it, so many sync envs still share one pool of browsers::

    with CoreThread(RunConfig(concurrency=8), serve_sites=True) as core:
        env = WebEnv(core, tasks=load_tasks(BUNDLED_TASKS, core.base_url))
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(model_reply_text)

Observations: ``screenshot`` (an ``(H, W, 3)`` uint8 array of the viewport), ``url`` and ``title``, and ``axtree``
(the accessibility tree's text) for an agent that observes it (``AgentConfig.observe``); the JPEG
bytes, settle status, page-changed, Set-of-Marks elements and the DOM snapshot's rows (an agent that observes
``dom``) are in ``info["observation"]``. The action space is
the model's reply text (any string up to ``max_reply_chars``); an action dict of the agent protocol is accepted
too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from engine.agent.prompts import AgentConfig
from engine.clients.env import AsyncWebEnv
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.rewards.judge import RubricJudge
from engine.tasks.schema import Task

T = TypeVar("T")
MAX_TEXT = 1 << 16
MAX_TREE = 1 << 22  # a tree's text: 3,000 nodes of up to 200-character names and values, and their states


class AnyText(spaces.Text):
    """Any string up to ``max_length`` characters (gymnasium's Text only admits its charset)."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class CoreThread:
    """An :class:`EngineCore` started on its own event loop (uvloop) in a daemon thread."""

    def __init__(self, cfg: RunConfig, *, judge: RubricJudge | None = None, base_url: str | None = None,
                 serve_sites: bool = False, site_mounts: dict[str, Path] | None = None) -> None:
        import uvloop

        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webgym-core", daemon=True)
        self._thread.start()
        self.core: EngineCore = self.call(self._make(cfg, judge, base_url, serve_sites, site_mounts))
        self.run_dir = self.call(self.core.start())

    @staticmethod
    async def _make(cfg: RunConfig, judge: RubricJudge | None, base_url: str | None, serve_sites: bool,
                    site_mounts: dict[str, Path] | None) -> EngineCore:
        # Built on the core's loop: its queues and semaphores belong there.
        return EngineCore(cfg, judge=judge, base_url=base_url, serve_sites=serve_sites, site_mounts=site_mounts)

    @property
    def base_url(self) -> str | None:
        return self.core.base_url

    @property
    def running(self) -> bool:
        """Whether the core's loop still runs (False once closed)."""
        return self._loop.is_running()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the core's loop and wait for its result (from a thread without a running loop)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the core's loop from any running loop (a trainer's own, or the core's)."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def close(self) -> None:
        """Close the core (episodes still running end with their records), stop the loop and the thread."""
        if not self._loop.is_running():
            return
        try:
            self.call(self.core.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()

    def __enter__(self) -> CoreThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WebEnv(gym.Env[dict[str, Any], str]):
    """One web-agent environment (module docstring). ``core``: a shared :class:`CoreThread`, or None for a
    private one built from ``cfg`` (closed with the env)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, core: CoreThread | None = None, tasks: Sequence[Task] = (), *, cfg: RunConfig | None = None,
                 agent: AgentConfig | None = None, render_mode: str | None = None,
                 max_reply_chars: int = MAX_TEXT) -> None:
        self._own_core = core is None
        self.core_thread = core or CoreThread(cfg or RunConfig(concurrency=1, workers=1), serve_sites=True)
        self.env = AsyncWebEnv(self.core_thread.core, tasks, agent=agent, decode=True)
        worker = self.core_thread.core.cfg.worker
        shape = (worker.viewport_height, worker.viewport_width, 3)
        fields: dict[str, spaces.Space[Any]] = {
            "screenshot": spaces.Box(0, 255, shape, np.uint8),
            "url": AnyText(MAX_TEXT, min_length=0),
            "title": AnyText(MAX_TEXT, min_length=0),
        }
        self._tree = self.env.protocol.cfg.axtree
        if self._tree:  # the agent reads the page's accessibility tree: its text, ids in brackets
            fields["axtree"] = AnyText(MAX_TREE, min_length=0)
        self.observation_space = spaces.Dict(fields)
        self.action_space = AnyText(max_reply_chars, min_length=0)
        self.render_mode = render_mode
        self._last: np.ndarray | None = None
        self.episode_id: str | None = None
        self.record: dict[str, Any] | None = None  # the last finished episode's record

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: ``options={"task_id": ...}`` picks the task, else one of ``tasks`` by ``seed``."""
        super().reset(seed=seed)
        task = (options or {}).get("task_id") or (options or {}).get("task")
        if task is None:  # gymnasium's seeded generator chooses, so reset(seed=s) is reproducible
            task = self.env.tasks[int(self.np_random.integers(len(self.env.tasks)))] if self.env.tasks else None
        obs, info = self.core_thread.call(self.env.reset(task))
        return self._split(obs, info)

    def step(self, action: str | dict[str, Any]) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.core_thread.call(self.env.step(action))
        info.pop("verdict", None)  # an asyncio future of the core's loop: useless to a sync caller
        observation, info = self._split(obs, info)
        return observation, reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        return self._last if self.render_mode == "rgb_array" else None

    def close(self) -> None:
        if self.core_thread.running:
            self.core_thread.call(self.env.close())
        if self._own_core:
            self.core_thread.close()

    def _split(self, obs: dict[str, Any], info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        image = obs.pop("image")
        self._last = image
        # What differs between two runs of the same seed and actions stays out of info (gymnasium's checker
        # compares infos): the episode's id, its stored frame and its record are attributes instead.
        self.episode_id = info.pop("episode_id", self.episode_id)
        info.pop("frame", None)
        self.record = info.pop("record", self.record)
        observation = {"screenshot": image, "url": obs["url"], "title": obs["title"]}
        if self._tree:
            observation["axtree"] = obs["axtree"] or ""
        return observation, {**info, "observation": obs}
