"""One episode as an explicit state machine, with the original's states and sub-statuses.

States: N not started, W waiting for a browser, R running, F finished, X failed.
Operations while running: n navigate, s screenshot, a model (policy) call, e execute, r reward.

A rollout advances one phase per :meth:`Rollout.advance` call (open the page; one step; finish), so
the asynchronous engine can run each rollout freely while the synchronous baseline advances a batch
in lock-step. Whatever happens, a rollout ends with exactly one record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import msgspec

from browserpool.pool import BrowserOpError, BrowserSession, Frame, WorkerLost
from browserpool.protocol import ERR_REFUSED, Observation, TrafficSpec
from engine.agent.policy_api import PolicyError, PolicyReply, PolicyRequest, StepView, training_fields, view_tree_text
from engine.episode.context import RolloutContext
from engine.episode.load_outcome import load_outcome
from engine.episode.record_parts import (
    EpisodeTrafficEntry,
    OpenEvents,
    PageLoad,
    event_entries,
    final_page,
    record_result,
    traffic_entry,
)
from engine.episode.status import ALLOWED_MOVES, EpisodeStatus, Op, State
from engine.episode.traffic_plan import RolloutTraffic
from engine.rewards.programmatic import Reward, judge_rewards, page_reward, program_reward
from engine.store.records import (
    BLOCKED_KINDS,
    FORMAT_VERSION,
    EpisodeRecord,
    PageEvent,
    RecordError,
    RecordErrorKind,
    RecordStatus,
    StepRecord,
    StepTraffic,
)
from engine.store.run_dir import StoreFailed, episode_key
from engine.tasks.schema import PageOpenArgs, Task
from engine.web.blocklist import block_reason, retry_after_s
from engine.web.bounds import bound_observation, cap_text
from engine.web.redact import mask_text, mask_url


class _EpisodeError(Exception):
    def __init__(self, kind: RecordErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Rollout:
    """Drives one episode from start to record."""

    def __init__(self, task: Task, sample: int, ctx: RolloutContext, episode_id: str | None = None) -> None:
        self.task = task
        self.sample = sample
        self.ctx = ctx
        # The id telemetry was given, when there is one: the string it keeps for the run is then this one.
        self.episode_id = episode_id if episode_id is not None else episode_key(task.task_id, sample)
        self.status = EpisodeStatus(self.episode_id, task.task_id, task=task.task_name)
        ctx.stats.move(None, self.status.state.value)
        self.record: EpisodeRecord | None = None
        self.ended = asyncio.Event()  # set once the record is written
        self.cut_requested = False  # the engine stopped this episode (a straggler) before it ran
        self.attempts = 0
        self.previous_errors: list[RecordError] = []
        self._deadline: float | None = None  # loop time at which the episode's wall-clock cap expires
        self._masked: tuple[Task, Task] | None = None  # (task, the task as the policy sees it: URL masked)
        self.traffic: RolloutTraffic | None = None  # its traffic recorded or replayed (the run's TrafficPlan)
        self._reset()

    def _reset(self) -> None:
        self.session: BrowserSession | None = None
        self.steps: list[StepRecord] = []
        self.history: list[StepView] = []
        self.current: StepView | None = None
        self.current_frame_path: str | None = None
        self.current_status: int | None = None  # the current page's main document's HTTP status
        self.current_load: dict[str, Any] | None = None  # what went wrong loading it (engine.episode.load_outcome)
        self.current_truncated: list[str] = []  # what the caps cut from the current observation
        self.page_url = ""  # the current page's real URL (records and prompts get it masked and capped)
        self.open_events: list[PageEvent] | None = None  # what the start page did as it loaded
        self.open_traffic: StepTraffic | None = None  # what its loads did to the recorded or replayed traffic
        self.block_for_s: float | None = None  # a block page's Retry-After: how long its domain stays blocked
        self.system_prompt: str | None = None
        self.frames_taken = 0
        self.answer: str | None = None
        self.page_state: dict[str, Any] | None = None  # the page's probe's last readable result (PageHooks)
        self.over = False
        self.started_at = time.time()  # reset when the episode starts running (its record counts from then)
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}

    # --- state ------------------------------------------------------------------------------------
    def _set(self, state: State, op: Op = Op.NONE) -> None:
        old = self.status.state
        if state is not old and state not in ALLOWED_MOVES[old]:
            raise RuntimeError(f"illegal rollout transition {old.name} -> {state.name}")
        self.status.state, self.status.op = state, op
        if state is not old:
            self.ctx.stats.move(old.value, state.value)
        if self.ctx.on_status:
            self.ctx.on_status(self.status)

    @property
    def finished(self) -> bool:
        return self.record is not None

    # --- driving ------------------------------------------------------------------------------------
    async def run(self) -> EpisodeRecord:
        """Run the whole episode (asynchronous mode)."""
        while not await self.advance():
            pass
        assert self.record is not None
        return self.record

    async def advance(self) -> bool:
        """Do the next phase; True once the record is written. Never raises for episode failures.

        With ``episode_timeout_s`` set, the phase runs under the episode's deadline (counted from its first
        phase, over all attempts): past it, whatever was in flight is cancelled, the browser released and
        the episode ends with an ``episode_timeout`` error record (never retried)."""
        if self.record is not None:
            return True
        cap = self.ctx.settings.episode_timeout_s
        if not cap:
            return await self._advance()
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().time() + cap
        try:
            async with asyncio.timeout_at(self._deadline):
                return await self._advance()
        except TimeoutError:  # only the deadline's: _advance turns every error of its own into a record
            await self._fail(RecordErrorKind.EPISODE_TIMEOUT, f"the episode ran past its wall-clock cap of {cap:g} s "
                                                f"({len(self.steps)} steps done)")
            return True

    async def _advance(self) -> bool:
        if self.record is not None:
            return True
        try:
            if self.session is None:
                await self._begin()
            elif not self.over:
                await self._step()
            else:
                await self._finish()
        except (WorkerLost, BrowserOpError, PolicyError, _EpisodeError) as exc:
            await self._on_error(exc)
        except (asyncio.CancelledError, StoreFailed):
            # An interrupted run, or one whose run directory cannot be written, has no record for this episode, so
            # that --resume runs it again.
            await asyncio.shield(self._release_browser())
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must not lose the episode
            await self._fail(RecordErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")
        return self.record is not None

    async def _begin(self) -> None:
        if self.attempts == 0:
            self.started_at, self.t0 = time.time(), time.monotonic()
        self.attempts += 1
        self._set(State.WAITING)
        t = time.monotonic()
        traffic = await self._traffic()  # a group member waits here for its group's start
        opened = False
        try:
            obs, frame = await self._open(traffic, t)
            opened = True
        finally:  # a group this rollout records for may now start (or, when it did not open, go live)
            if self.ctx.traffic is not None and self.traffic is not None:
                self.ctx.traffic.opened(self.traffic, opened)
        if obs.traffic is not None:
            self.open_traffic = traffic_entry(obs.traffic)
        self._set(State.RUNNING, Op.SCREENSHOT)
        self._take_observation(obs, frame, self._bound(obs))
        self.open_events = event_entries(obs)  # what the start page did as it loaded (refused loads, popups...)
        blocked = block_reason(obs.status, obs.title)
        if blocked is not None:  # the site refuses the agent: the core puts its domain on the blocklist
            self.block_for_s = retry_after_s(obs.retry_after)
            if self.block_for_s is not None:
                blocked += f", Retry-After {self.block_for_s:.0f} s"
            raise _EpisodeError(RecordErrorKind.BLOCKED, f"{blocked} ({self.page_url[:200]})")
        if isinstance(obs.probe, dict) and "error" not in obs.probe:
            self.page_state = obs.probe
            utterance = obs.probe.get("utterance")
            if isinstance(utterance, str) and utterance.strip():
                # The instruction the page generated for this episode: what the policy sees and the record
                # keeps (a copy: the Task itself is shared and immutable).
                self.task = dataclasses.replace(self.task, task_name=utterance.strip())
                self.status.task = self.task.task_name
            self.over = bool(obs.probe.get("done"))

    async def _open(self, traffic: TrafficSpec | None, waiting_since: float) -> tuple[Observation, Frame]:
        """Lease a browser and open the task's start page in it."""
        self.session = await self.ctx.pool.lease(self.episode_id)
        self.timings["wait_browser_ms"] = round((time.monotonic() - waiting_since) * 1000, 1)
        self._set(State.RUNNING, Op.NAVIGATE)
        # A page that runs its own episode (engine.tasks.schema.PageHooks): its setup script and probe. Plain tasks
        # send neither.
        page = self.task.page
        page_args: PageOpenArgs = page.open_args({"episode_id": self.episode_id, "task_id": self.task.task_id,
                                    "sample": self.sample}) if page else {}
        await self._before_action(self.task.website, self.timings)
        t = time.monotonic()
        # The worker draws only the elements the prompt can list (page_limits.elements): no box without its line.
        opened = await self.session.open(self.task.website, som=self.ctx.policy.som,
                                         som_elements=self.ctx.settings.page_limits.elements,
                                         axtree=self.ctx.policy.axtree, dom=self.ctx.policy.dom, traffic=traffic,
                                         **page_args)
        self.timings["navigate_ms"] = round((time.monotonic() - t) * 1000, 1)
        return opened

    async def _traffic(self) -> TrafficSpec | None:
        """The episode's traffic spec (None: live), chosen once (a retry keeps it); a replay without an archive
        for the task ends the episode (``traffic_missing``)."""
        plan = self.ctx.traffic
        if plan is None:
            return None
        if self.traffic is None:
            try:
                self.traffic = await plan.episode(self.task.task_id, self.sample, self.episode_id)
            except FileNotFoundError as exc:
                raise _EpisodeError(RecordErrorKind.TRAFFIC_MISSING, str(exc)) from None
        return self.traffic.spec

    async def _step(self) -> None:
        assert self.session is not None and self.current is not None
        index = len(self.steps)
        cap = self.task.step_cap(self.ctx.settings.split, self.ctx.settings.step_caps)
        self.status.step = index
        t_step = time.monotonic()
        self._set(State.RUNNING, Op.MODEL)
        reply = await self._ask_policy(index)
        t_policy = time.monotonic()
        try:
            token_ids, logprobs, version = training_fields(reply)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"the policy's reply to step {index}: {exc}") from None
        action = reply.action
        loaded: PageLoad = {}
        if self.current_status is not None:
            loaded["http_status"] = self.current_status
        if self.current_load is not None:
            loaded["load"] = self.current_load
        step: StepRecord = {
            "step": index, "url": self.current.url, "title": self.current.title,
            "screenshot": self.current_frame_path, "settled": self.current.settled, **loaded,
            "action": action.to_dict(), "action_text": action.describe(), "reply": reply.text,
            "thought": reply.thought, "parse_error": reply.parse_error,
            "policy_version": version if version is not None else self.ctx.settings.policy_version,
        }
        if self.current.elements is not None:
            step["elements"] = self.current.elements  # Set-of-Marks: what the numbered boxes were
        if self.current.axtree is not None:
            step["axtree"] = view_tree_text(self.current)  # the tree whose ids the action could name
        if self.current.dom is not None:
            step["dom"] = msgspec.to_builtins(self.current.dom)  # the boxes and visibility the step saw: rows
        if self.current_truncated:
            step["truncated"] = self.current_truncated  # what the caps cut from the page the step acted on
        if reply.details is not None:
            step["parsed"] = reply.details
        if reply.messages is not None:
            step["messages"] = self._without_system(reply.messages)
        if token_ids is not None:
            step["token_ids"], step["logprobs"] = token_ids, logprobs
        timings = {"policy_ms": round((t_policy - t_step) * 1000, 2)}
        self.current.action = action
        self.current.reply = reply.text
        self.status.action, self.status.thought = action.describe(), (reply.thought or "")[:500]
        self.current.action_text = (reply.details or {}).get("action_text")
        if action.ends_episode:
            self.answer = action.text or ""
            self.over = True
        else:
            # The site the action goes to (a wait sends nothing): the per-domain rate counts it.
            target = action.url if action.name == "navigate" and action.url else self.current.url
            await self._before_action(target if action.name != "wait" else None, timings)
            self._set(State.RUNNING, Op.EXECUTE)
            try:
                obs, frame = await self.session.act(action.to_browser())
            except BrowserOpError as exc:
                if exc.kind != ERR_REFUSED:
                    raise
                # The page is unchanged; the agent may try again.
                step["error"] = self._error_text(f"refused: {exc}")
                self._repeat_observation()
            else:
                cut = self._bound(obs)
                timings.update(obs.timings_ms)
                self._set(State.RUNNING, Op.SCREENSHOT)
                changed = self._take_observation(obs, frame, cut)
                record_result(step, obs, self.current_frame_path, cut, changed)
                if isinstance(obs.probe, dict) and "error" not in obs.probe:
                    self.page_state = obs.probe
                    if obs.probe.get("done"):
                        self.over = True  # the page ended its episode: its reward is final
        timings["step_ms"] = round((time.monotonic() - t_step) * 1000, 2)
        step["timings_ms"] = timings
        self.status.step_timings_ms = timings
        self.ctx.stats.record_step_phases(timings)
        self.steps.append(step)
        self.ctx.stats.record_step(timings["step_ms"])
        if not self.over and len(self.steps) >= cap:
            self.over = True

    def _without_system(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The step's messages, the system prompt stored once per episode instead of once per step."""
        if messages and messages[0].get("role") == "system":
            if self.system_prompt is None:
                self.system_prompt = messages[0]["content"]
            if messages[0]["content"] == self.system_prompt:
                return messages[1:]
        return messages

    def _repeat_observation(self) -> None:
        """A refused action left the page as it was: the next step sees the same screenshot again."""
        assert self.current is not None
        cur = self.current
        cur.page_changed = False
        self._push_history(cur)
        self.current = StepView(cur.url, cur.title, cur.jpeg, cur.width, cur.height, cur.settled, cur.frame,
                                cur.elements, axtree=cur.axtree, axtree_cut=cur.axtree_cut,
                                axtree_text=cur.axtree_text, dom=cur.dom)

    def _push_history(self, view: StepView) -> None:
        self.history.append(view)
        # Only the screenshots the policy reads stay in memory (the store has them all).
        keep = self.ctx.policy.history_frames
        if len(self.history) > keep:
            self.history[-keep - 1].jpeg = None

    async def _ask_policy(self, index: int) -> PolicyReply:
        assert self.current is not None
        # The history list is shared, not copied per step: policies only read it.
        request = PolicyRequest(self.episode_id, self._policy_task(), index, self.current, self.history,
                                self.session if self.ctx.policy.wants_page_probe else None,
                                self.ctx.settings.policy_version)
        cap = self.ctx.settings.policy_step_timeout_s
        async with self.ctx.policy_slots:
            if not cap:
                return await self.ctx.policy.act(request)
            # Cancelling the call frees its backend slot; a hung server costs this episode, not the run.
            timeout = asyncio.timeout(cap)
            try:
                async with timeout:
                    return await self.ctx.policy.act(request)
            except TimeoutError:
                if not timeout.expired():
                    raise
                raise _EpisodeError(RecordErrorKind.POLICY_TIMEOUT, f"the policy gave no reply within {cap:g} s "
                                                      f"(step {index})") from None

    def _policy_task(self) -> Task:
        """The task as the policy sees it: its website's credentials masked (the prompt is recorded and goes
        to a model server; the engine navigates with the real URL)."""
        if self._masked is None or self._masked[0] is not self.task:
            website = mask_url(self.task.website)
            self._masked = (self.task, self.task if website == self.task.website
                            else dataclasses.replace(self.task, website=website))
        return self._masked[1]

    def _bound(self, obs: Observation) -> list[str]:
        """Cap the observation's page texts and mask its URL in place (what records, prompts and the monitor
        get); the real URL stays in ``page_url`` for the engine's own URL checks. Returns what was cut."""
        self.page_url = obs.url if isinstance(obs.url, str) else ""
        return bound_observation(obs, self.ctx.settings.page_limits)

    async def _before_action(self, url: str | None, timings: dict[str, float]) -> None:
        """Wait for the site's turn (``url``; None: the action sends nothing to a site) and for room among the
        screenshots queued to be written (too many: the disk is slower than the run); what was waited goes into
        ``timings`` as ``pace_ms`` and ``store_wait_ms``."""
        paced = await self._pace(url) if url is not None else 0.0
        if paced:
            timings["pace_ms"] = round(paced * 1000, 1)
        stored = await self.ctx.store.frame_room()
        if stored:
            timings["store_wait_ms"] = round(stored * 1000, 1)

    async def _pace(self, url: str) -> float:
        """Wait for the site's turn (the run's per-domain action rate); the seconds waited."""
        return await self.ctx.pace(url) if self.ctx.pace is not None else 0.0

    def _take_observation(self, obs: Observation, frame: Frame, truncated: list[str]) -> bool | None:
        """Store the screenshot as received, note whether the page changed (the worker compared), free the slot.
        ``obs`` is already bounded (:meth:`_bound`); ``truncated`` says what that cut."""
        if not frame.view:
            frame.release()
            raise _EpisodeError(RecordErrorKind.NO_SCREENSHOT, "the worker returned no screenshot")
        jpeg: bytes | None = None
        if self.ctx.policy.reads_pixels:
            with frame:  # the slot goes back to the worker now; the copy goes to the store and the prompt
                jpeg = bytes(frame.view)
            path = self.ctx.store.queue_frame(self.episode_id, self.frames_taken, jpeg)
        else:  # written from the slot itself, which goes back once the file is written
            path = self.ctx.store.queue_frame(self.episode_id, self.frames_taken, frame.view, frame.release)
        self.frames_taken += 1
        self.current_status = obs.status  # the page's main document's HTTP status
        self.current_load = load_outcome(obs.status, obs.load_error, obs.events)  # a failed load, typed
        changed = None
        if self.current is not None:
            # The worker compares consecutive screenshots; its first one of an episode has nothing to compare. Any
            # difference is a change, as in the original's exact comparison of the frames (Observation.change).
            changed = obs.change > 0.0 if obs.change is not None else None
            self.current.page_changed = changed
            self._push_history(self.current)
        self.current = StepView(obs.url, obs.title, jpeg, obs.width, obs.height, obs.settled, path, obs.elements,
                                axtree=obs.axtree, axtree_cut=obs.axtree_cut, dom=obs.dom)
        self.current_frame_path = path
        self.current_truncated = truncated
        self.status.url, self.status.title, self.status.screenshot = obs.url, obs.title, path
        return changed

    async def _finish(self) -> None:
        assert self.session is not None and self.current is not None
        self._set(State.RUNNING, Op.REWARD)
        if self._judged():
            # The judge reads the stored screenshots later: record now, free the browser, never wait.
            await self._write("judge_pending")
            assert self.ctx.judge is not None and self.record is not None
            if self.record["status"] == "judge_pending":  # not when its screenshots could not be stored
                self.ctx.judge.submit(self.task, self.record)
        else:
            t_reward = time.monotonic()
            reward = await self._reward()
            self.ctx.stats.record_phase("judge", (time.monotonic() - t_reward) * 1000)
            self.status.reward = reward.value
            await self._write(reward.status, reward=reward)  # success, failure or unrewarded
        self._set(State.FINISHED)
        await self._release_browser()

    def _judged(self) -> bool:
        """Whether the judge gives this episode's reward (``--reward``; auto prefers the task's own checks)."""
        return judge_rewards(self.task, self.ctx.judge is not None, self.ctx.settings.reward)

    async def end_with_error(self, kind: RecordErrorKind, message: str) -> EpisodeRecord:
        """End the episode now with an error record (if it has none yet; a ``blocked`` record for a kind of
        :data:`engine.store.records.BLOCKED_KINDS`); returns its record."""
        await self._fail(kind, message)
        assert self.record is not None
        return self.record

    async def _reward(self) -> Reward:
        assert self.session is not None and self.current is not None
        if self.task.reward_from_page:
            return page_reward(self.page_state)
        if not self.task.has_checks:
            return Reward(None, "none", "no programmatic checks for this task (a judge is needed)")
        return await program_reward(self.task, self.page_url, self.answer, self.session.evaluate)

    async def _on_error(self, exc: Exception) -> None:
        kind: RecordErrorKind
        if isinstance(exc, WorkerLost):
            kind = RecordErrorKind.WORKER_LOST
        elif isinstance(exc, BrowserOpError):
            kind = RecordErrorKind.of_browser(exc.kind)
        elif isinstance(exc, _EpisodeError):
            kind = exc.kind
        else:
            kind = RecordErrorKind.POLICY
        if isinstance(exc, WorkerLost) and self.attempts <= self.ctx.settings.retry_lost:
            self.previous_errors.append({"kind": kind, "message": self._error_text(str(exc))})
            await self._release_browser()
            await self.ctx.policy.end_episode(self.episode_id)
            self._reset()
            self._set(State.WAITING)
            return
        await self._fail(kind, str(exc))

    def _error_text(self, message: str) -> str:
        """An error message as records keep it: capped, credentials in URLs masked."""
        return cap_text(mask_text(message), self.ctx.settings.page_limits.text_chars)

    async def _fail(self, kind: RecordErrorKind, message: str) -> None:
        try:
            if self.record is None:
                self.status.error = kind
                # A site that refused the agent is no fault of the episode's and no failure of the agent's.
                status: RecordStatus = "blocked" if kind in BLOCKED_KINDS else "error"
                await self._write(status, error={"kind": kind, "message": self._error_text(message)})
                self._set(State.FAILED)
        finally:  # a store that failed writes no record, and the browser still goes back
            await self._release_browser()

    async def _release_browser(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            self.over = True
            await session.close()
        if self.record is not None:
            await self.ctx.policy.end_episode(self.episode_id)

    async def _write(self, status: RecordStatus, reward: Reward | None = None,
                     error: RecordError | None = None) -> None:
        """Publish the episode's record (once its screenshots are written: readers open them at once)."""
        cur = self.current
        opened: OpenEvents = {"open_events": self.open_events} if self.open_events else {}
        record: EpisodeRecord
        self.record = record = {
            "format_version": FORMAT_VERSION,
            "episode_id": self.episode_id,
            "sample": self.sample,
            "task": self._policy_task().to_dict(),  # the website's credentials masked
            "policy": self.ctx.policy.name,
            "system_prompt": self.system_prompt,
            "mode": self.ctx.settings.mode,
            "worker": self.session.worker_id if self.session else None,
            "status": status,
            "reward": reward.to_dict() if reward else None,
            "answer": self.answer,
            "error": error,
            "attempts": self.attempts,
            "previous_errors": self.previous_errors,
            **opened,
            **self._traffic_record(),
            "steps": self.steps,
            "final": final_page(cur, self.current_frame_path, self.current_truncated),
            "started_at": self.started_at,
            "duration_s": round(time.monotonic() - self.t0, 3),
            "timings_ms": self.timings,
        }
        try:
            await self.ctx.store.frames_landed(self.episode_id)
        except StoreFailed:  # no record: the core stops the run, and --resume runs this episode again
            self.record = None
            raise
        finally:
            if self.record is not None:  # even when cancelled while waiting: every episode that ends has its record
                self._publish(record)

    def _traffic_record(self) -> EpisodeTrafficEntry:
        """The record's ``traffic``, for an episode that records or replays it."""
        if self.traffic is None:
            return {}
        entry = self.traffic.info.copy()
        if self.open_traffic is not None:
            entry["open"] = self.open_traffic
        return {"traffic": entry}

    def _publish(self, record: EpisodeRecord) -> None:
        """Append the record and count it; a store that failed leaves the episode with no record."""
        try:
            self.ctx.store.append(record)
        except StoreFailed:
            self.record = None
            raise
        self.ctx.stats.record_episode(record["status"])
        self.ended.set()
