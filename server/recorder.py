"""A lease as an episode of the run: a live cell in the monitor always, and with recording on one record in
``RUN_DIR/episodes.jsonl`` (its action commands as steps, each with the screenshot the client last took before it,
and its timings), so that ``webgym-engine view`` and the monitor show server traffic as they show ``run``'s."""

from __future__ import annotations

import logging
import time
from typing import Any

from engine.core.core import EngineCore
from engine.episode.status import EpisodeStatus, Op, State
from engine.store.records import (
    FORMAT_VERSION,
    ActionRecord,
    EpisodeRecord,
    RecordError,
    RecordStatus,
    StepRecord,
)
from engine.store.run_dir import StoreFailed, episode_key
from engine.web.redact import mask_url

log = logging.getLogger("webgym_engine.server")
POLICY_NAME = "http-client"  # the records' policy: whoever drives the lease over HTTP


class LeaseRecorder:
    """Tracks one lease in the core's stats and telemetry; ``record``: also writes its record and frames. A run
    directory that cannot be written (a full disk) ends recording, never the serving of leases."""

    def __init__(self, core: EngineCore, lease_name: str, instance_id: str, record: bool) -> None:
        self.core = core
        self.record = record and core.store is not None and core.store.failure is None
        self.task_id = lease_name
        self.episode_id = episode_key(lease_name, 0)
        self.instance_id = instance_id
        self.status = EpisodeStatus(self.episode_id, lease_name, task=f"browser lease {instance_id}")
        self.steps: list[StepRecord] = []
        self.frames = 0
        self.frame_path: str | None = None  # the last screenshot the client took (the next step acted on it)
        # The accessibility tree (its text) and the DOM snapshot (rows) the client read since the last action: the
        # next step records them beside its screenshot.
        self.axtree: str | None = None
        self.dom: list[Any] | None = None
        self.url, self.title, self.first_url = "about:blank", "", ""
        self.worker: str | None = None
        self.lease_ms = 0.0
        self.queries: dict[str, float] = {}  # the information commands' time (ms) and count, by command
        self.started_at, self.t0 = time.time(), time.monotonic()
        self.ended = False
        core.stats.total += 1
        core.stats.move(None, State.NOT_STARTED.value)
        self._set(State.WAITING)

    def leased(self, worker: str, lease_ms: float) -> None:
        """The lease has its browser context."""
        self.worker = worker
        self.lease_ms = lease_ms
        self._set(State.RUNNING, Op.NONE)

    def screenshot(self, image: bytes | memoryview, url: str, title: str, fmt: str) -> None:
        """The client took a screenshot (stored only when recording, and only as JPEG: PNGs are left out)."""
        self._page(url, title)
        if self.record and fmt == "jpeg":
            try:
                self.frame_path = self.core.store.write_frame(self.episode_id, self.frames, image)
            except StoreFailed as exc:
                self._stop_recording(exc)
            else:
                self.frames += 1
                self.status.screenshot = self.frame_path
        self._set(State.RUNNING, Op.SCREENSHOT)

    def page_read(self, axtree: str | None = None, dom: list[Any] | None = None) -> None:
        """The client read the page's accessibility tree or its DOM snapshot (the next step records what it read)."""
        if not self.record:
            return
        if axtree is not None:
            self.axtree = axtree
        if dom is not None:
            self.dom = dom

    def step(self, action: ActionRecord, text: str, timings_ms: dict[str, float], result: dict[str, Any],
             error: str | None = None) -> None:
        """One action command ran (or was refused: ``error``)."""
        if self.record:
            self.steps.append(self._step(action, text, timings_ms, result, error))
        if error is None:
            self._page(str(result.get("url", "")), str(result.get("title", "")))
        stats = self.core.stats
        stats.record_step(timings_ms.get("step_ms", 0.0))
        stats.record_step_phases(timings_ms)
        self.status.step += 1
        self.status.action, self.status.step_timings_ms = text, timings_ms
        self._set(State.RUNNING, Op.EXECUTE)

    def query(self, name: str, ms: float) -> None:
        """An information command (``get_page_metadata``, ``get_screenshot_info``...): not a step of the record;
        its count and time go into the record's timings (``<name>_ms``, ``<name>_n``)."""
        self.queries[f"{name}_ms"] = round(self.queries.get(f"{name}_ms", 0.0) + ms, 2)
        self.queries[f"{name}_n"] = self.queries.get(f"{name}_n", 0) + 1

    def end(self, error: RecordError | None = None) -> None:
        """The lease ended: released by the client (``error`` None), expired or lost. Once."""
        if self.ended:
            return
        self.ended = True
        # A lease has no task to check (its client computes its own reward): nothing here scores it.
        status: RecordStatus = "error" if error is not None else "unrewarded"
        if self.record:
            try:
                self.core.store.append(self._record(status, error))
            except StoreFailed as exc:
                self._stop_recording(exc)
        self.core.stats.record_episode(status)
        self.status.error = error["kind"] if error is not None else ""
        self._set(State.FAILED if error is not None else State.FINISHED)

    # --- internals ------------------------------------------------------------------------------------
    def _stop_recording(self, exc: StoreFailed) -> None:
        self.record = False
        log.warning("lease %s is no longer recorded: %s", self.instance_id, exc)

    def _step(self, action: ActionRecord, text: str, timings_ms: dict[str, float], result: dict[str, Any],
              error: str | None) -> StepRecord:
        """The step's record: the page the command acted on (the client's last screenshot) and what it did."""
        step: StepRecord = {
            "step": len(self.steps), "url": mask_url(self.url), "title": self.title, "screenshot": self.frame_path,
            "settled": True, "action": action, "action_text": text, "reply": text, "thought": None,
            "parse_error": None, "policy_version": None, "timings_ms": timings_ms}
        if self.axtree is not None:
            step["axtree"] = self.axtree
        if self.dom is not None:
            step["dom"] = self.dom
        self.axtree = self.dom = None  # read again for the page the action left
        if error is not None:
            step["error"] = error
            return step
        step["result"] = {"url": mask_url(str(result.get("url", ""))), "title": str(result.get("title", "")),
                          "settle": str(result.get("settle", ""))}
        if result.get("point") is not None:
            step["point"] = list(result["point"])
        return step

    def _page(self, url: str, title: str) -> None:
        self.url, self.title = url, title
        if not self.first_url and url and url != "about:blank":
            self.first_url = url
        self.status.url, self.status.title = mask_url(url), title

    def _set(self, state: State, op: Op = Op.NONE) -> None:
        old = self.status.state
        self.status.state, self.status.op = state, op
        if state is not old:
            self.core.stats.move(old.value, state.value)
        self.core.publish_status(self.status)

    def _record(self, status: RecordStatus, error: RecordError | None) -> EpisodeRecord:
        return {
            "format_version": FORMAT_VERSION, "episode_id": self.episode_id, "sample": 0,
            "task": {"task_id": self.task_id, "task_name": self.status.task,
                     "website": mask_url(self.first_url or "about:blank")},
            "policy": POLICY_NAME, "system_prompt": None, "mode": "server", "worker": self.worker,
            "status": status,
            # A lease has no task to check: the client computes its own reward.
            "reward": None if error is not None else {"value": None, "source": "none",
                                                      "reason": "a browser lease: its client rewards it"},
            "answer": None, "error": error, "attempts": 1, "previous_errors": [], "steps": self.steps,
            "final": {"url": mask_url(self.url), "title": self.title, "settled": True, "screenshot": self.frame_path},
            "started_at": self.started_at, "duration_s": round(time.monotonic() - self.t0, 3),
            "timings_ms": {"wait_browser_ms": self.lease_ms, **self.queries},
        }
