"""TRL: the engine's web tasks as an environment of ``trl.GRPOTrainer`` (``environment_factory``).

TRL runs the multi-turn loop itself: for each rollout it calls the environment's ``reset`` (whose answer, the
task and its first screenshot, is appended to the prompt), generates, parses the reply's tool calls with the
tokenizer's response parser, calls the environment's methods of those names and appends what they return as a
tool message, until the model stops calling tools (or ``max_tool_calling_iterations`` / ``max_completion_length``
is reached); ``get_reward`` then scores the rollout. Screenshots travel as image parts of those messages, so a
vision-language model sees every page and TRL's loss is computed with them (its multimodal tool responses).

:class:`WebEnvironment` is one such environment: an :class:`engine.clients.env.AsyncWebEnv` on a shared engine core
(:class:`engine.clients.gym_env.CoreThread`). Its one tool is ``computer_use`` (the agent protocol's function, in Qwen's
tool-call format); each call becomes the reply text ``<tool_call>{"name": "computer_use", ...}</tool_call>`` and
steps the episode through the engine's own parser and coordinate frames, exactly as ``webgym-engine run`` reads a
model's reply; the tool answers with the new screenshot. So each rollout is an ordinary engine episode: leased,
bounded, rewarded, judged and recorded in the run directory::

    from trl import GRPOConfig, GRPOTrainer
    from engine.core.config import RunConfig
    from engine.clients.gym_env import CoreThread
    from engine.tasks.schema import BUNDLED_TASKS
    from engine.tasks.loading import load_tasks
    from train.adapters.trl import environment_factory, web_dataset

    core = CoreThread(RunConfig(concurrency=16), serve_sites=True)
    tasks = load_tasks(BUNDLED_TASKS, core.base_url)
    trainer = GRPOTrainer(model="Qwen/Qwen3-VL-2B-Instruct", args=GRPOConfig(...),
                          train_dataset=web_dataset(tasks, viewport=core.core.cfg.worker),
                          environment_factory=environment_factory(core, tasks))
    trainer.train()

Where TRL's chat differs from ``run``'s: the conversation grows with every step (TRL keeps the whole history in
one sequence) instead of ``run``'s context window of the last ``window`` screenshots, and each new screenshot
comes back as a tool message rather than a user message. The system prompt is the engine's (the action help,
the coordinate system and the response format), without the tool listing, which the chat template renders from
``computer_use``'s signature.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.agent.coords import CoordFrame
from engine.agent.prompts import AgentConfig, tool_schema
from engine.agent.protocol import AgentProtocol
from engine.clients.env import AsyncWebEnv, EpisodeError
from engine.clients.gym_env import CoreThread
from engine.store.records import EpisodeRecord, reward_value
from engine.tasks.schema import Task

from . import FrameworkVersion, _settled_reward, jpeg_to_pil

__all__ = ["TRL", "WebEnvironment", "environment_factory", "web_dataset", "web_system_prompt"]

#: The TRL versions this adapter supports (the ``trl`` extra of ``pyproject.toml`` pins ``tested``):
#: ``GRPOTrainer(environment_factory=...)`` is experimental, and its calls into the environment changed before it.
TRL = FrameworkVersion("TRL", "trl", tested="1.16.0", minimum="1.16.0")
TRL.check()

SYSTEM_TEMPLATE = """\
You are a web agent. You operate a web browser to complete the user's task with the computer_use function. \
After every action you see a screenshot of the current page.

{tool}

# Response format

{response_format}"""

ENDED_TEXT = "The episode has ended; no further actions are possible."


def _viewport(viewport: Any) -> tuple[int, int]:
    if isinstance(viewport, tuple):
        return int(viewport[0]), int(viewport[1])
    return int(viewport.viewport_width), int(viewport.viewport_height)


def web_system_prompt(agent: AgentConfig | None = None, viewport: Any = (1280, 720)) -> str:
    """The system prompt of a TRL rollout: the engine's (action help, coordinate system, response format) for a
    ``viewport`` of ``(width, height)`` CSS pixels (or a ``WorkerConfig``), without the tool listing that the chat
    template renders from :meth:`WebEnvironment.computer_use`."""
    protocol = AgentProtocol(agent)
    width, height = _viewport(viewport)
    make = CoordFrame.grid if protocol.cfg.coords == "grid" else CoordFrame.pixels
    frame = make(width, height, **protocol.resize)
    size = (frame.resized_width or frame.width, frame.resized_height or frame.height)
    description = tool_schema(protocol.cfg, *size)["function"]["description"]
    templates = protocol.templates
    fmt = templates.complete_format if protocol.cfg.response_format == "complete" else templates.vanilla_format
    return SYSTEM_TEMPLATE.format(tool=description, response_format=fmt)


def web_dataset(tasks: Sequence[Task], *, agent: AgentConfig | None = None, viewport: Any = (1280, 720),
                repeat: int = 1) -> Any:
    """A ``datasets.Dataset`` for ``GRPOTrainer``: one row per task (``repeat`` times over), each with the system
    prompt of :func:`web_system_prompt`, an empty user message (``WebEnvironment.reset`` fills it with the task
    and its first screenshot) and the ``task_id`` that ``reset`` receives."""
    from datasets import Dataset

    system = web_system_prompt(agent, viewport)
    rows = [t.task_id for _ in range(repeat) for t in tasks]
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    return Dataset.from_dict({"prompt": [prompt] * len(rows), "task_id": rows})


class WebEnvironment:
    """One TRL environment (module docstring): an :class:`AsyncWebEnv` of ``core``'s engine over ``tasks``.

    TRL makes one per concurrent rollout and reuses them (``reset`` between rollouts). ``agent``: the agent
    protocol (prompt, coordinate frames, Set-of-Marks). ``timeout_s``: the longest a reset or a step may take.

    After a rollout: ``record`` (the episode's record, as in ``episodes.jsonl``), ``episode_id``, ``steps`` (the
    number of actions taken) and ``reward``. Every public method other than ``reset`` and ``get_reward`` is a tool
    to TRL, hence the single one.
    """

    def __init__(self, core: CoreThread, tasks: Sequence[Task], *, agent: AgentConfig | None = None,
                 timeout_s: float | None = 600.0) -> None:
        self._core = core
        self._env = AsyncWebEnv(core.core, tasks, agent=agent)
        self._timeout_s = timeout_s
        self._live = False
        self.record: EpisodeRecord | None = None
        self.episode_id: str | None = None
        self.steps = 0
        self.reward = 0.0

    # --- TRL's environment interface ------------------------------------------------------------------
    def reset(self, task_id: str | None = None, **_: Any) -> list[dict[str, Any]] | str:
        """Start an episode of ``task_id`` (the dataset row's column); returns the first user turn: the task and
        the first screenshot (plus the element list with Set-of-Marks), appended by TRL to the prompt."""
        self.record, self.steps, self.reward = None, 0, 0.0

        async def start() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, bytes]]:
            _, info = await self._env.reset(task_id)
            chat, images = self._env.messages() if not info.get("ended") else ([], {})
            return info, chat, images

        try:
            info, chat, images = self._core.call(start(), self._timeout_s)
        except EpisodeError as exc:  # it could not open (its record says why): nothing to act on, reward 0
            self._live, self.record, self.episode_id = False, exc.record, exc.record.get("episode_id")
            return f"{ENDED_TEXT} (It could not start: {exc.kind}.)"
        self.episode_id = info.get("episode_id")
        if info.get("ended"):  # the page ended the episode as it opened
            self._live = False
            self.record = info.get("record")
            self.reward = float((reward_value(self.record) if self.record else None) or 0.0)
            return ENDED_TEXT
        self._live = True
        return _user_parts(chat[-1], images)

    def computer_use(self, action: str, coordinate: list[float] | None = None, text: str | None = None,
                     direction: str | None = None, time: float | None = None, url: str | None = None,
                     element_id: int | None = None) -> list[dict[str, Any]] | str:
        """Use a mouse and keyboard to interact with the web browser; returns a screenshot of the page afterwards.

        Args:
            action: The action to perform. (choices: ["left_click", "type", "hover", "select", "scroll", "wait", "go_back", "navigate", "answer"])
            coordinate: (x, y): the point to click or type at, on the screen's coordinates.
            text: Text to type, option to select, or the final answer.
            direction: Scroll direction. (choices: ["up", "down"])
            time: Seconds to wait.
            url: The URL to open.
            element_id: The number of a marked element (Set-of-Marks only).
        """  # noqa: E501 (the choices must stay on the argument's line for the JSON schema)
        if not self._live:
            return ENDED_TEXT
        arguments: dict[str, Any] = {"action": action}
        for name, value in (("coordinate", coordinate), ("text", text), ("direction", direction), ("time", time),
                            ("url", url), ("element_id", element_id)):
            if value is not None:
                arguments[name] = value
        reply = "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": arguments}) + "\n</tool_call>"
        timeout = self._timeout_s

        async def step() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, bytes]]:
            _, reward, terminated, truncated, info = await self._env.step(reply)
            if terminated or truncated:
                reward = await _settled_reward(reward, info, timeout)
                info.pop("verdict", None)
                return {**info, "reward": reward, "ended": True}, [], {}
            chat, images = self._env.messages()
            return info, chat, images

        try:
            info, chat, images = self._core.call(step(), timeout)
        except EpisodeError as exc:
            self._live, self.record, self.reward = False, exc.record, 0.0
            raise
        self.steps += 1
        if info.get("ended"):
            self._live = False
            self.record, self.reward = info.get("record"), float(info["reward"])
            return ENDED_TEXT
        parts = _user_parts(chat[-1], images)
        if info.get("parse_error"):
            parts.insert(0, {"type": "text", "text": f"The call could not be used ({info['parse_error']}); "
                                                     "nothing was done."})
        return parts

    def get_reward(self) -> float:
        """The episode's reward: the task checks', the page's own or the judge's. An episode the model left
        unfinished (no more tool calls, or TRL's limits reached) ends here with an ``abandoned`` record and 0."""
        if self._live:
            self._live = False
            self._core.call(self._env.close(), self._timeout_s)
            self.record, self.reward = self._env.record, 0.0
        return self.reward


def environment_factory(core: CoreThread, tasks: Sequence[Task], *, agent: AgentConfig | None = None,
                        timeout_s: float | None = 600.0) -> Callable[[], WebEnvironment]:
    """The ``environment_factory`` argument of ``GRPOTrainer``: makes :class:`WebEnvironment` s on one core."""
    return functools.partial(WebEnvironment, core, tasks, agent=agent, timeout_s=timeout_s)


def _user_parts(message: Mapping[str, Any], images: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The parts of an engine user message, in order, with each image REF replaced by its ``PIL.Image``."""
    content: Any = message.get("content")  # a user message's: its text, or its parts
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "image", "image": jpeg_to_pil(images[p["image"]])} if p.get("type") == "image" else dict(p)
            for p in content if p.get("type") == "image" or p.get("text")]
