"""Judging finished episodes off the rollout path.

A rollout whose reward comes from the judge writes its record with status ``judge_pending`` and hands it
here; it never waits. :class:`JudgeQueue` judges up to ``max_episodes`` episodes at a time (the judge
itself caps its calls in flight), reads the screenshots back from the run directory, and appends each
verdict to ``judgements.jsonl``. A judge failure (the endpoint down, or no verdict line even after the
reminder) leaves the episode pending with the error; ``webgym-engine judge RUN_DIR`` judges it again later,
and also the episodes of a run that had no judge (``unrewarded``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from engine.rewards.judge import JudgeError, RubricJudge
from engine.store.records import EpisodeRecord, Judgement, RecordError
from engine.store.run_dir import FrameRefError, RunStore, frame_file, read_records
from engine.tasks.loading import parse_task
from engine.tasks.schema import Task

log = logging.getLogger(__name__)


def episode_screenshots(record: EpisodeRecord) -> list[str]:
    """The stored screenshots of an episode in step order, the final page last (each once)."""
    refs = [shot for s in record.get("steps", []) if (shot := s.get("screenshot"))]
    final = (record.get("final") or {}).get("screenshot")
    if final:
        refs.append(final)
    return list(dict.fromkeys(refs))


class JudgeQueue:
    """Judges episodes in the background and stores the verdicts; ``on_verdict(judgement, record)`` follows each."""

    def __init__(self, judge: RubricJudge, store: RunStore, max_episodes: int = 32,
                 on_verdict: Callable[[Judgement, EpisodeRecord], None] | None = None) -> None:
        self.judge = judge
        self.store = store
        self.on_verdict = on_verdict
        self._slots = asyncio.Semaphore(max_episodes)
        self._tasks: set[asyncio.Task[Judgement]] = set()
        self.judged = 0
        self.failed = 0

    def submit(self, task: Task, record: EpisodeRecord) -> None:
        """Queue one episode; returns at once."""
        t = asyncio.ensure_future(self._run(task, record))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every submitted episode has its verdict (or its error)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def judge_record(self, task: Task, record: EpisodeRecord) -> Judgement:
        """Judge one episode and store the verdict; never raises for a judge failure. Raises
        :class:`~engine.store.run_dir.StoreFailed` when the run directory cannot be written (no judge call is spent on a
        verdict that could not be stored once that is known)."""
        self.store.raise_if_failed()
        judgement: Judgement = {"episode_id": record["episode_id"], "reward": None, "error": None}
        t0 = time.monotonic()
        try:
            refs = episode_screenshots(record)
            shots = await asyncio.to_thread(self._read, refs)
            steps = [s.get("action_text", "") for s in record.get("steps", [])]
            reward = await self.judge.judge(task, record.get("answer"), shots, steps)
            judgement["reward"] = reward.to_dict()
            self.judged += 1
        except (JudgeError, OSError, FrameRefError) as exc:
            judgement["error"] = f"{type(exc).__name__}: {exc}"
            self.failed += 1
            log.warning("judge: episode %s stays pending: %s", record["episode_id"], exc)
        judgement["judged_at"] = time.time()
        judgement["judge_ms"] = round((time.monotonic() - t0) * 1000, 1)
        self.store.append_judgement(judgement)
        if self.on_verdict:
            self.on_verdict(judgement, record)
        return judgement

    def _read(self, refs: list[str]) -> list[tuple[str, bytes]]:
        return [(ref, frame_file(self.store.dir, ref).read_bytes()) for ref in refs]

    async def _run(self, task: Task, record: EpisodeRecord) -> Judgement:
        async with self._slots:
            return await self.judge_record(task, record)


def submit_records(queue: JudgeQueue, run_dir: str | Path, records: list[EpisodeRecord]) -> None:
    """Queue stored records of ``run_dir`` for judging (their tasks are read back from the records)."""
    for i, record in enumerate(records):
        queue.submit(parse_task(record["task"], Path(run_dir) / "episodes.jsonl", f"record {i + 1}"), record)


def _to_judge(record: EpisodeRecord, everything: bool) -> bool:
    """Whether :func:`rejudge` judges ``record``: pending or unrewarded (nothing scored it: the run had no judge);
    with ``everything``, every episode that reached its end (also those the judge found blocked; not those a
    block page or the blocklist stopped)."""
    status = record["status"]
    if status in ("judge_pending", "unrewarded"):
        return True
    error: RecordError | dict[str, str] = record.get("error") or {}
    ended = status in ("success", "failure") or error.get("kind") == "judge_blocked"
    return everything and ended


async def rejudge(run_dir: str | Path, judge: RubricJudge, everything: bool = False) -> dict[str, int]:
    """Judge the pending and unrewarded episodes of a run (every episode that reached its end, with
    ``everything``); verdicts are appended to the run's ``judgements.jsonl``. Returns counts by outcome
    (``judged``, then by status: success, failure, unrewarded, blocked, and ``pending``); raises
    :class:`~engine.store.run_dir.StoreFailed` when a verdict could not be stored (those not stored stay pending)."""
    todo = [r for r in read_records(run_dir) if _to_judge(r, everything)]
    store = RunStore(run_dir)
    await judge.start()
    try:
        queue = JudgeQueue(judge, store, max_episodes=judge.cfg.concurrency)
        submit_records(queue, run_dir, todo)
        await queue.drain()
        store.raise_if_failed()
    finally:
        await judge.close()
        store.close()
    ids = {r["episode_id"] for r in todo}
    outcomes = [r["status"] for r in read_records(run_dir) if r["episode_id"] in ids]
    return {"judged": len(todo), **{status: outcomes.count(status) for status in ("success", "failure", "unrewarded",
                                                                                "blocked")},
            "pending": outcomes.count("judge_pending")}
