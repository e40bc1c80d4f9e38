"""A session: one OpenEnv client's environment, an :class:`AsyncWebEnv` of the server's one engine core.

A reset starts an ordinary engine episode on the task the client names (by id, by index in the task file, by
BrowserGym's task name, by seed, or the next one in turn); a step hands it the client's action. Every episode a
session starts ends as exactly one record: by itself (success, failure, step limit, an error of the engine's),
by the next reset or the client's close (``abandoned``), or by the client going away (``client_gone``) or falling
silent (``client_idle``): errors, never task failures, so no trainer takes them for reward 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from engine.clients.env import AsyncWebEnv, EpisodeError
from engine.core.core import EngineCore
from engine.store.records import RecordErrorKind
from engine.tasks.schema import Task
from server.openenv.config import OpenEnvConfig
from server.openenv.vocabularies import (
    ResetOptions,
    SessionState,
    StepOutcome,
    Turn,
    Vocabulary,
    read_options,
    vocabulary,
)
from server.openenv.wire import ErrorCode, WireError, invalid, step_result


class TaskPicker:
    """The server's tasks, and which one a reset gets."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            raise ValueError("the OpenEnv server needs at least one task")
        self.tasks = list(tasks)
        self._by_id = {t.task_id: t for t in self.tasks}
        self._turn = itertools.count()

    def pick(self, options: ResetOptions) -> Task:
        """``task_id``, else ``task_index``, else ``task_name`` (a task id, or a MiniWoB++ task's name), else the
        task ``seed`` selects (``seed`` modulo the number of tasks), else the next task in turn."""
        if options.task_id is not None:
            return self._named(options.task_id, "task_id")
        if options.task_index is not None:
            if not 0 <= options.task_index < len(self.tasks):
                raise invalid(["task_index"], f"no task {options.task_index}: the server has {len(self.tasks)}")
            return self.tasks[options.task_index]
        if options.task_name is not None:
            name = options.task_name
            return self._named(name if name in self._by_id else f"miniwob.{name}", "task_name", shown=name)
        if options.seed is not None:
            return self.tasks[options.seed % len(self.tasks)]
        return self.tasks[next(self._turn) % len(self.tasks)]

    def _named(self, task_id: str, key: str, shown: str | None = None) -> Task:
        task = self._by_id.get(task_id)
        if task is None:
            raise invalid([key], f"no task {shown or task_id!r} among the server's {len(self.tasks)}")
        return task


class OpenEnvSession:
    """One client's environment (module docstring). Its calls come one at a time, from its connection's loop."""

    def __init__(self, core: EngineCore, picker: TaskPicker, cfg: OpenEnvConfig) -> None:
        self.core = core
        self.picker = picker
        self.cfg = cfg
        self.vocab: Vocabulary = vocabulary(ResetOptions(), cfg.vocabulary, cfg.screenshot)
        self.env: AsyncWebEnv | None = None
        self.progress = SessionState()

    async def reset(self, data: dict[str, Any] | None) -> dict[str, Any]:
        """Start an episode; OpenEnv's step result of its first observation."""
        options, dropped = read_options(data)
        vocab = vocabulary(options, self.cfg.vocabulary, self.cfg.screenshot)
        agent = vocab.agent()
        task = self.picker.pick(options)
        await self.end()  # the last episode, if still running: abandoned
        self.vocab, self.env = vocab, AsyncWebEnv(self.core, [task], agent=agent)
        try:
            obs, info = await self.env.reset(task)
        except EpisodeError as exc:  # it has its record
            raise WireError(ErrorCode.EXECUTION_ERROR, str(exc)) from None
        settings = self.core.cfg.rollout_settings(0)
        rollout = self.env.rollout
        assert rollout is not None
        self.progress = SessionState(episode_id=str(info["episode_id"]), task_id=task.task_id,
                                     benchmark=task.benchmark_name, goal=rollout.task.task_name,
                                     url=str(obs.get("url") or ""),
                                     max_steps=task.step_cap(settings.split, settings.step_caps))
        metadata: dict[str, Any] = {"episode_id": self.progress.episode_id, "task_id": task.task_id}
        if dropped:
            metadata["ignored"] = dropped  # reset keys this server does not take
        outcome, done = StepOutcome(), bool(info.get("ended"))
        if done:  # the page ended the episode as it opened
            outcome = self._ended(info["record"])
        return self._result(Turn(obs, self.progress.goal, self.progress.cum_reward, done, outcome, metadata))

    async def step(self, data: dict[str, Any]) -> dict[str, Any]:
        """Act; OpenEnv's step result of the next observation (the reward on the episode's last step)."""
        action = self.vocab.action(data)
        env = self.env
        if env is None:
            raise WireError(ErrorCode.EXECUTION_ERROR, "no episode: reset first")
        try:
            obs, reward, terminated, truncated, info = await env.step(action)
        except EpisodeError as exc:  # the engine ended the episode (a lost browser, its time cap): its record
            self.progress.status = exc.record.get("status")
            raise WireError(ErrorCode.EXECUTION_ERROR, str(exc)) from None
        except (RuntimeError, TypeError, ValueError) as exc:  # no episode running, an ill-formed action dict
            raise WireError(ErrorCode.EXECUTION_ERROR, str(exc)) from None
        progress = self.progress
        progress.step_count += 1
        progress.url = str(obs.get("url") or "")
        progress.cum_reward += reward
        done = terminated or truncated
        outcome = (self._ended(info["record"]) if done else StepOutcome())
        outcome.action, outcome.parse_error = info.get("action"), info.get("parse_error")
        metadata = {"episode_id": progress.episode_id, "task_id": progress.task_id}
        return self._result(Turn(obs, progress.goal, reward, done, outcome, metadata))

    def state(self) -> dict[str, Any]:
        return self.vocab.state(self.progress)

    async def end(self, kind: RecordErrorKind = RecordErrorKind.ABANDONED,
                  reason: str = "the client reset or closed its session before the episode ended") -> None:
        """End a running episode with an error record of ``kind`` (nothing if none runs)."""
        env, self.env = self.env, None
        if env is not None:
            await env.close(kind, reason)

    def _ended(self, record: dict[str, Any]) -> StepOutcome:
        self.progress.status = record.get("status")
        error = record.get("error") or {}
        return StepOutcome(status=record.get("status"), error=error.get("kind"))

    def _result(self, turn: Turn) -> dict[str, Any]:
        return step_result(self.vocab.observation(turn), turn.reward, turn.done)

