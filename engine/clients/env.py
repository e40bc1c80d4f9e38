"""Step-level environments for trainers that own the loop (veRL, AReaL, TRL, OpenRLHF, slime, their own).

An :class:`AsyncWebEnv` is a client of an :class:`engine.core.core.EngineCore`: it runs one episode at a time as an
ordinary rollout of the core, whose policy is the trainer itself. ``reset`` starts the rollout and returns its
first observation; ``step`` hands the trainer's action to the rollout and returns the next observation. So an
env's episode is leased, settled, bounded, rewarded, judged, recorded (RUN_DIR/episodes.jsonl, frames) and
shown in the monitor exactly as ``webgym-engine run`` does it, and many envs share one core: one pool of
browsers, each env holding one browser context at a time::

    async with EngineCore(RunConfig(concurrency=64), serve_sites=True) as core:
        envs = [AsyncWebEnv(core, tasks) for _ in range(64)]
        obs, info = await envs[0].reset("shop-find-price")
        chat, images = envs[0].messages()          # what `run` would send the model now
        obs, reward, terminated, truncated, info = await envs[0].step(reply_text)

Actions are the agent protocol's action dict (``{"name": "left_click", "x": 10, "y": 20}``, CSS pixels) or
the model's raw reply text, read by the same parser and coordinate frames as ``run`` (an unusable reply is a
recorded ``wait``, its parse error in ``info["parse_error"]``). With an agent that observes the accessibility tree
(``AgentConfig(observe=("axtree",), action_format="browsergym")``) each observation's ``axtree`` is the tree's text,
and replies name its elements by id (``click('12')``); one that observes the DOM snapshot too (``"dom"``) gets
its elements as ``dom``, rows of :class:`browserpool.protocol.DOMNode`'s fields (id, parent, tag, x, y, w, h in
viewport CSS px, visibility 0..1, clickable), and the tree's lines marked ``clickable`` and ``visible``. An
episode that ends with an error (its browser worker died, it ran past its time cap) or that its site blocked (a
block page, a site on the blocklist: status ``blocked``) raises :class:`EpisodeError` from ``step`` or ``reset``;
it has its record, and the next ``reset`` starts afresh. A run directory that cannot be written (a full disk) raises
:class:`engine.store.run_dir.StoreFailed` from ``step`` and ``reset``: nothing more can be recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import msgspec

from engine import _imgcodec as codec
from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyReply, PolicyRequest, StepView, training_fields, view_tree_text
from engine.agent.prompts import AgentConfig
from engine.agent.protocol import AgentProtocol
from engine.core.core import EngineCore
from engine.episode.rollout import Rollout
from engine.store.records import EpisodeRecord, RecordError, RecordErrorKind, reward_value
from engine.tasks.schema import Task

Observation = dict[str, Any]


class EpisodeError(RuntimeError):
    """The episode ended before its end with an error record (``kind``: worker_lost, episode_timeout,
    browser_*...) or a ``blocked`` one (``kind``: blocked, blocked_domain)."""

    def __init__(self, record: EpisodeRecord) -> None:
        error: RecordError | dict[str, str] = record.get("error") or {}
        self.kind: str = error.get("kind", "error")
        self.record = record
        super().__init__(f"episode {record.get('episode_id')} ended with an error ({self.kind}): "
                         f"{error.get('message', '')}")


class _TrainerPolicy(Policy):
    """The rollout's policy is the trainer: ``act`` hands the request out and waits for the env's ``step``."""

    name = "env"

    def __init__(self, protocol: AgentProtocol, oracle: bool) -> None:
        self.som = protocol.som
        self.axtree = protocol.cfg.axtree
        self.dom = protocol.cfg.dom
        self.history_frames = protocol.window  # the screenshots messages() shows
        self.wants_page_probe = oracle
        self.asked: asyncio.Future[PolicyRequest | None] | None = None
        self.reply: asyncio.Future[PolicyReply] | None = None

    async def act(self, request: PolicyRequest) -> PolicyReply:
        self.reply = asyncio.get_running_loop().create_future()
        if self.asked is not None and not self.asked.done():
            self.asked.set_result(request)
        return await self.reply

    def episode_ended(self, _job: object) -> None:
        """The episode's task is done (its record written, or cancelled): wake the env waiting for a request."""
        if self.asked is not None and not self.asked.done():
            self.asked.set_result(None)


class AsyncWebEnv:
    """One environment of many on a shared core (module docstring).

    ``tasks``: what ``reset()`` picks from when given no task (by ``seed``); a task id given to ``reset`` is
    looked up here. ``agent``: the protocol that reads reply text and builds :meth:`messages` (the defaults of
    ``run``). ``decode``: observations also carry the screenshot as an ``(H, W, 3)`` uint8 array (decoded by
    the C codec). ``oracle``: the policy request (``env.request``) carries page access for scripted
    demonstrations. ``policy_version``: recorded with every step unless ``step`` says otherwise.
    """

    def __init__(self, core: EngineCore, tasks: Sequence[Task] = (), *, agent: AgentConfig | None = None,
                 decode: bool = False, oracle: bool = False, policy_version: int = 0) -> None:
        self.core = core
        self.tasks = list(tasks)
        self._by_id = {t.task_id: t for t in self.tasks}
        self.protocol = AgentProtocol(agent)
        self.decode = decode
        self.policy_version = policy_version
        self._policy = _TrainerPolicy(self.protocol, oracle)
        self._rng = random.Random()
        self.rollout: Rollout | None = None
        self._job: asyncio.Future[EpisodeRecord] | None = None
        self._verdict: asyncio.Future[EpisodeRecord] | None = None  # the judged episode's merged record
        self.record: EpisodeRecord | None = None  # the last finished episode's record
        # A step() cancelled while it waited (a trainer's own timeout): the episode went on to an observation the
        # trainer never got, so a next step would act on a page it has not seen. Only reset() goes on from there.
        self._step_cancelled = False
        self._stepping = False  # a step() waits for its observation: a second one at once is the caller's mistake

    # --- the episode ----------------------------------------------------------------------------------
    async def reset(self, task: Task | str | None = None,
                    seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start an episode of ``task`` (a Task, a task id of ``tasks``, or None: one of ``tasks`` chosen by
        ``seed``); returns its first observation and info. An episode still running ends first, with an
        ``abandoned`` error record."""
        if seed is not None:
            self._rng.seed(seed)
        chosen = self._choose(task)
        await self._abandon("the environment was reset before the episode ended")
        self.core.store.raise_if_failed()  # no episode could be recorded
        self._step_cancelled = False
        settings = dataclasses.replace(self.core.cfg.rollout_settings(self.policy_version), retry_lost=0)
        # A private slot: a trainer thinking over one env must not hold up the core's shared policy queue.
        ctx = self.core.context(self._policy, settings=settings, policy_slots=asyncio.Semaphore(1))
        self.rollout = self.core.rollout(ctx, chosen)
        self.record = None
        verdict = self._verdict = asyncio.get_running_loop().create_future()

        def on_verdict(merged: EpisodeRecord) -> None:
            if not verdict.done():
                verdict.set_result(merged)

        self._job = asyncio.ensure_future(self.core.run_episode(self.rollout, on_verdict=on_verdict))
        request = await self._next_request()
        if request is None:
            return self._ended_at_open()
        return self._observation(), self._info(request)

    async def step(self, action: dict[str, Any] | str | AgentAction, *, token_ids: Any = None,
                   logprobs: Any = None, policy_version: int | None = None
                   ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Act: an action dict, an :class:`AgentAction`, or the model's reply text. ``token_ids`` /
        ``logprobs``: the sampled tokens (lists, numpy arrays or torch tensors), recorded with the step for
        training. Returns ``(observation, reward,
        terminated, truncated, info)``; the reward is the episode's (task checks, the page's own, or the judge's)
        on its last step and 0 before. After a step that was cancelled (a timeout of the caller's own) the episode
        has moved past what the caller saw: every later step raises RuntimeError until ``reset()``."""
        policy, rollout = self._policy, self.rollout
        if self._step_cancelled:
            raise RuntimeError("a step() was cancelled before its observation came back: reset() the environment")
        if self._stepping:
            raise RuntimeError("another step() of this environment is still waiting for its observation: await it "
                               "before the next")
        if rollout is None or policy.reply is None or policy.reply.done():
            raise RuntimeError("reset() the environment first (the last episode has ended)")
        self.core.store.raise_if_failed()  # no episode could be recorded
        reply = self._reply(action, rollout)
        reply.token_ids, reply.logprobs, reply.policy_version = token_ids, logprobs, policy_version
        # The caller's mistake (a string for a token id, lists of different lengths) is raised here, before anything
        # is sent. Numpy arrays and torch tensors are made plain lists once, here: the rollout's own check of them
        # then has plain numbers to read.
        reply.token_ids, reply.logprobs, reply.policy_version = training_fields(reply)
        policy.reply.set_result(reply)
        self._stepping = True
        try:
            request = await self._next_request()
        except asyncio.CancelledError:
            self._step_cancelled = True
            raise
        finally:
            self._stepping = False
        info: dict[str, Any] = {"action": reply.action.to_dict(), "parse_error": reply.parse_error,
                                "thought": reply.thought}
        if request is not None:
            return self._observation(), 0.0, False, False, {**self._info(request), **info}
        return self._finished(info)

    def messages(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """The chat ``run`` would give a model now (system prompt, context window, summaries, ``<think>``
        stripped; images by REF) and the JPEG bytes of every REF."""
        rollout = self._live()
        assert rollout.current is not None
        return self.protocol.messages(rollout._policy_task(), rollout.history, rollout.current)

    @property
    def request(self) -> PolicyRequest | None:
        """The decision the episode waits for (task, observation, history; page access with ``oracle``)."""
        asked = self._policy.asked
        return asked.result() if asked is not None and asked.done() and not self._ended() else None

    async def close(self, kind: RecordErrorKind = RecordErrorKind.ABANDONED,
                    reason: str = "the environment was closed before the episode ended") -> None:
        """End a running episode (an error record of ``kind``, ``abandoned`` by default) and free its browser."""
        await self._abandon(reason, kind)

    async def __aenter__(self) -> AsyncWebEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- internals ------------------------------------------------------------------------------------
    def _choose(self, task: Task | str | None) -> Task:
        if isinstance(task, Task):
            return task
        if isinstance(task, str):
            if task not in self._by_id:
                raise KeyError(f"no task {task!r} among this environment's {len(self.tasks)} tasks")
            return self._by_id[task]
        if not self.tasks:
            raise ValueError("reset() needs a task: this environment was given no tasks to choose from")
        return self._rng.choice(self.tasks)

    def _live(self) -> Rollout:
        if self.rollout is None or self.rollout.current is None:
            raise RuntimeError("reset() the environment first")
        return self.rollout

    def _ended(self) -> bool:
        return self._job is None or self._job.done()

    async def _next_request(self) -> PolicyRequest | None:
        """The rollout's next request for an action, or None once the episode has its record."""
        job = self._job
        assert job is not None
        if not job.done():
            # One future per step: the rollout's next act() fills it, or the episode's end does (a done
            # callback, cheaper than asyncio.wait's per-call bookkeeping on this hot path).
            asked = self._policy.asked = asyncio.get_running_loop().create_future()
            job.add_done_callback(self._policy.episode_ended)
            try:
                request = await asked
            finally:
                job.remove_done_callback(self._policy.episode_ended)
            if request is not None:
                return request
        self.record = job.result()
        if self.record["status"] in ("error", "blocked"):  # no observation to end on: the site or the engine stopped it
            raise EpisodeError(self.record)
        return None

    def _reply(self, action: dict[str, Any] | str | AgentAction, rollout: Rollout) -> PolicyReply:
        if isinstance(action, AgentAction):
            return PolicyReply(action, text=action.describe())
        if isinstance(action, dict):
            act = AgentAction.from_dict(action)  # a malformed dict is the caller's bug: TypeError / ValueError
            return PolicyReply(act, text=act.describe())
        if not isinstance(action, str):
            raise TypeError(f"an action is a dict, an AgentAction or reply text, not {type(action).__name__}")
        assert rollout.current is not None
        messages, _ = self.messages()
        read = self.protocol.read(action, rollout.current)
        return PolicyReply(read.action, text=action, thought=read.thought, parse_error=read.parse_error,
                           messages=messages, details=read.details)

    def _observation(self) -> Observation:
        rollout = self._live()
        view: StepView = rollout.current  # type: ignore[assignment]
        last = rollout.steps[-1] if rollout.steps else None
        jpeg = bytes(view.jpeg) if view.jpeg is not None else b""
        obs: Observation = {
            "screenshot": jpeg, "url": view.url, "title": view.title, "width": view.width, "height": view.height,
            "settled": view.settled, "settle": (last.get("result") or {}).get("settle") if last else None,
            "page_changed": last.get("page_changed") if last else None, "step": len(rollout.steps),
            "elements": view.elements,
            # The accessibility tree as the prompt shows it (agents that observe it: AgentConfig.observe), else None.
            "axtree": view_tree_text(view) if view.axtree is not None else None,
            "dom": msgspec.to_builtins(view.dom) if view.dom is not None else None,  # likewise the DOM snapshot
        }
        if self.decode and jpeg:
            obs["image"] = codec.decode(jpeg)
        return obs

    def _info(self, request: PolicyRequest) -> dict[str, Any]:
        rollout = self._live()
        return {"episode_id": rollout.episode_id, "task_id": rollout.task.task_id, "task": rollout.task.task_name,
                "step": request.step, "frame": rollout.current_frame_path}

    def _ended_at_open(self) -> tuple[Observation, dict[str, Any]]:
        # The page ended its episode as it opened (a MiniWoB++ page can): the observation and the record.
        assert self.record is not None
        return self._observation(), {"episode_id": self.record["episode_id"], "record": self.record, "ended": True}

    def _finished(self, info: dict[str, Any]) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        rollout, record = self._live(), self.record
        assert record is not None
        reward = reward_value(record)
        ended_by_agent = rollout.answer is not None or bool((getattr(rollout, "page_state", None) or {}).get("done"))
        info = {**info, "episode_id": record["episode_id"], "record": record, "status": record["status"]}
        if record["status"] == "judge_pending":
            info["verdict"] = self._verdict  # resolves to the record with the judge's reward merged in
        return self._observation(), float(reward or 0.0), ended_by_agent, not ended_by_agent, info

    async def _abandon(self, reason: str, kind: RecordErrorKind = RecordErrorKind.ABANDONED) -> None:
        job, rollout = self._job, self.rollout
        self._job = None
        if job is None or rollout is None or job.done():
            return
        job.cancel()  # the rollout releases its browser and writes nothing ...
        with contextlib.suppress(asyncio.CancelledError):
            await job
        # ... so the env writes its one record
        self.record = await rollout.end_with_error(kind, reason)
