"""Live telemetry for monitors: compact state deltas and periodic aggregates on a ZeroMQ socket.

The engine calls :meth:`TelemetryPublisher.on_status` on every state or operation change of a rollout;
that only remembers the status object and marks it dirty (O(1), nothing serialised on the hot path). A
task ticking at ``hz`` (10 by default) sends one msgpack message per tick with the dirty cells, and a few
times a second the aggregates (counts, rates, latencies, queues, workers).

The socket is an XPUB (a PUB that also hears subscriptions): with no monitor attached the ticks build and
send nothing, and a new monitor gets a full snapshot at once. Sends never block the engine: the send
high-water mark is small and a message that does not fit is dropped (PUB semantics); every ``snapshot_s``
a compact snapshot of all cells heals whatever a slow monitor lost.

The messages are typed (:mod:`engine.telemetry.wire`): a delta, a snapshot or the end marker, with the
cells ``(state, op, step, reward)``, the task ids of newly announced cells, the details that changed (task, url,
title, action, thought, screenshot, timings, error) and the aggregates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import msgspec
import zmq

from browserpool.auth import CurveGuard, KeyFileError, ServerKeys
from browserpool.protocol import HANDSHAKE_TIMEOUT_MS
from engine.episode.status import EpisodeStatus, Op, State
from engine.store.records import STATUSES
from engine.store.stats import RunStats
from engine.telemetry.wire import (
    FORMAT_VERSION,
    MAX_TEXT,
    Aggregate,
    Cell,
    Details,
    EndpointInfo,
    Outcomes,
    Queues,
    TelemetryMessage,
    WorkerRow,
)
from engine.telemetry.wire import encode as encode_message

if TYPE_CHECKING:
    from browserpool.pool import BrowserPool

log = logging.getLogger(__name__)
ENDPOINT_FILE = "telemetry.json"
DETAIL_FIELDS = ("task", "url", "title", "action", "thought", "screenshot", "step_timings_ms", "error")
DETAIL_NAMES = {"step_timings_ms": "timings"}  # wire names that differ from EpisodeStatus's
_IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux
# Finished episodes whose details stay at hand for a monitor that attaches later; older ones keep their cell only,
# so that the publisher holds a dictionary entry per finished episode over a run of any length, not its whole status.
KEEP_FINISHED = 256
_NOT_STARTED: Cell = (State.NOT_STARTED.value, Op.NONE.value, 0, None)


@dataclass(frozen=True, kw_only=True)
class CoreGauges:
    """What the publisher reads of an engine core for its aggregates (built by the core's ``gauges()``)."""

    stats: RunStats
    pool: BrowserPool | None
    policy_slots: asyncio.Semaphore
    policy_cap: int
    judge_pending: Callable[[], int]


def _cell_of(st: EpisodeStatus) -> Cell:
    return (st.state.value, st.op.value, st.step, st.reward)


def _outcomes(stats: RunStats) -> Outcomes:
    """The run's finished episodes by record status, each apart (never below 0: a monitor refuses that)."""
    return Outcomes(**{status: max(0, stats.outcomes[status]) for status in STATUSES})


def ipc_endpoint(run_dir: str | Path) -> str:
    """An ipc:// endpoint inside the run directory, or under the temp directory when that path is too long."""
    path = Path(run_dir).resolve() / "telemetry.sock"
    if len(str(path)) > _IPC_PATH_MAX:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"webgym-telemetry-{digest}.sock"
    return f"ipc://{path}"


def resolve_endpoint(spec: str, run_dir: str | Path) -> str:
    """``ipc`` -> an ipc path for the run directory; ``tcp://host:port`` (port may be ``*``) as given."""
    if spec == "ipc":
        return ipc_endpoint(run_dir)
    if spec.startswith(("tcp://", "ipc://")):
        return spec
    raise ValueError(f"telemetry endpoint must be 'ipc', tcp://HOST:PORT or ipc://PATH, not {spec!r}")


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + "…"
    return value


class TelemetryPublisher:
    """Publishes the engine's live state; see the module docstring for the message format.

    ``endpoint`` None builds messages without a socket (recording, tests). Attach the engine's counters with
    :meth:`attach`, announce planned episodes with :meth:`add_episodes`, then :meth:`start` the ticking task.
    """

    def __init__(self, endpoint: str | None, run_dir: str | Path | None = None, *, hz: float = 10.0,
                 agg_hz: float = 2.0, snapshot_s: float = 2.0, hwm: int = 100,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 server_keys: ServerKeys | None = None, insecure: bool = False) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_name = self.run_dir.name if self.run_dir is not None else ""
        self.hz, self.agg_hz, self.snapshot_s = min(hz, 10.0), min(agg_hz, hz), snapshot_s
        self.clock, self.wall = clock, wall
        self.stats: RunStats | None = None
        self.pool: BrowserPool | None = None
        self.policy_slots: asyncio.Semaphore | None = None
        self.policy_cap = 0
        self.judge_pending: Callable[[], int] | None = None
        self.tasks: dict[str, str] = {}  # every announced episode, in the order announced
        self.statuses: dict[str, EpisodeStatus] = {}  # the started ones and the last KEEP_FINISHED finished ones
        self._settled: dict[str, Cell] = {}  # the cells of episodes finished before those
        # One tuple per distinct settled cell, shared by every episode that ended the same way. States, ops, step
        # counts and rubric rewards take few values, so a long run holds few tuples here, not one per episode.
        self._cell_values: dict[Cell, Cell] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()  # finished episodes in ``statuses``, oldest first
        self._dirty: dict[str, None] = {}  # an ordered set: messages come out the same every run
        self._unannounced: dict[str, None] = {}
        self._sent_details: dict[str, tuple[Any, ...]] = {}
        self._seq = 0
        self._last_snapshot = -1e18
        self._last_agg = -1e18
        self._rates: deque[tuple[float, int, int]] = deque(maxlen=64)  # (clock, steps, episodes done)
        self._spark: deque[float] = deque(maxlen=60)
        self._last_rate = -1e18
        self._phases_at = -1e18
        self._phases_cache: dict[str, tuple[float, float, int]] = {}
        self._steps_per_s = self._eps_per_s = 0.0
        self.subscribed = endpoint is None  # without a socket every tick builds its message (recording)
        self._want_full = True
        self.sent = 0
        self.dropped = 0
        self.tick_cpu_s = 0.0
        self.endpoint: str | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._guard: CurveGuard | None = None
        if endpoint is not None:
            self._bind(endpoint, hwm, server_keys, insecure)

    # --- wiring -------------------------------------------------------------------------------------
    def _bind(self, endpoint: str, hwm: int, keys: ServerKeys | None, insecure: bool) -> None:
        if keys is None and endpoint.startswith("tcp://") and not insecure:
            raise KeyFileError(f"telemetry on {endpoint} is tcp: give the engine CURVE keys (RunConfig.server_key, "
                               "allow_keys) or accept any subscriber with RunConfig.insecure")
        self._ctx = zmq.Context(io_threads=1)
        sock = self._ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.MAXMSGSIZE, 4096)  # a subscriber only ever sends (un)subscriptions
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
        if keys is not None:
            # The same keys as the worker socket: a monitor connects like a worker does (--server-key, --key).
            self._guard = CurveGuard(self._ctx, keys)
            self._guard.start()
            keys.apply(sock)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.LINGER, 500)  # the final snapshot still reaches an attached monitor at close
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every new subscriber is heard: it gets a full snapshot
        if endpoint.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(endpoint[len("ipc://"):])  # a stale socket file of a killed run
        sock.bind(endpoint)
        self._sock = sock
        # A bytes option (pyzmq types every option's value as int | bytes).
        self.endpoint = cast(bytes, sock.getsockopt(zmq.LAST_ENDPOINT)).decode()
        self.started_at = self.wall()
        if self.run_dir is not None:
            self._write_endpoint_file()

    def _write_endpoint_file(self, ended_at: float | None = None) -> None:
        assert self.run_dir is not None and self.endpoint is not None
        info = EndpointInfo(self.endpoint, os.getpid(), self.started_at, ended_at)
        tmp = self.run_dir / f".{ENDPOINT_FILE}.tmp"
        tmp.write_bytes(msgspec.json.encode(info))
        tmp.replace(self.run_dir / ENDPOINT_FILE)  # atomic: a monitor never reads half a file

    def attach(self, gauges: CoreGauges) -> None:
        """Read the counters, pool, policy queue and judge queue of an engine core."""
        self.stats = gauges.stats
        self.pool = gauges.pool
        self.policy_slots = gauges.policy_slots
        self.policy_cap = gauges.policy_cap
        self.judge_pending = gauges.judge_pending

    def add_episodes(self, episodes: Iterable[tuple[str, str]]) -> None:
        """Announce planned episodes ``(episode_id, task_id)``: they show as not started until they move."""
        for eid, task_id in episodes:
            if eid not in self.tasks:
                self.tasks[eid] = task_id
                self._unannounced[eid] = None
                self._dirty[eid] = None

    def on_status(self, status: EpisodeStatus) -> None:
        """The engine's status callback: remember the status object and mark it dirty (O(1))."""
        eid = status.episode_id
        if self.statuses.get(eid) is not status:
            self.statuses[eid] = status
            self._settled.pop(eid, None)  # a late change (a judge's verdict) brings a settled episode back
            if eid not in self.tasks:
                self.tasks[eid] = status.task_id
                self._unannounced[eid] = None
        self._dirty[eid] = None
        if status.ended:
            self._finished[eid] = None
            self._finished.move_to_end(eid)
        elif eid in self._finished:  # the same episode again, under a new status (a resumed run): live, keep it
            del self._finished[eid]

    def _settle(self) -> None:
        """Keep only the cells of all but the last KEEP_FINISHED finished episodes (called once their last change
        was sent or nobody listens, so a monitor never misses an episode's end)."""
        while len(self._finished) > KEEP_FINISHED:
            eid, _ = self._finished.popitem(last=False)
            cell = self.cell(eid)
            self._settled[eid] = self._cell_values.setdefault(cell, cell)
            del self.statuses[eid]
            self._sent_details.pop(eid, None)

    def cell(self, eid: str) -> Cell:
        """An announced episode's ``(state, op, step, reward)``."""
        st = self.statuses.get(eid)
        return _cell_of(st) if st is not None else self._settled.get(eid, _NOT_STARTED)

    # --- messages -----------------------------------------------------------------------------------

    def _details(self, eid: str, st: EpisodeStatus, force: bool) -> Details | None:
        values = tuple(getattr(st, f) for f in DETAIL_FIELDS)
        last = self._sent_details.get(eid)
        if last is not None and not force and last == values:
            return None
        self._sent_details[eid] = values
        out = {}
        for f, v, old in zip(DETAIL_FIELDS, values, last or (None,) * len(values), strict=True):
            if (force or v != old) and (v or last is not None):  # a fresh cell's empty fields go unsaid
                out[DETAIL_NAMES.get(f, f)] = _short(v)
        return Details(**out) if out else None

    def message(self, kind: Literal["delta", "snapshot"] | None = None,
                full_details: bool = False) -> TelemetryMessage | None:
        """Build the next message; None when there is nothing to say. Resets the dirty set.

        ``kind`` None picks: a snapshot every ``snapshot_s``, else a delta (with aggregates when due).
        """
        now = self.clock()
        if kind is None:
            kind = "snapshot" if now - self._last_snapshot >= self.snapshot_s else "delta"
        statuses = self.statuses
        if kind == "delta":
            eids: Iterable[str] = self._dirty
            tasks = {e: self.tasks[e] for e in self._unannounced}
        else:
            self._last_snapshot = now
            self._phases_at = -1e18  # snapshots carry fresh percentiles (deltas reuse them)
            eids = self.tasks.keys()
            tasks = dict(self.tasks)
        cells: dict[str, Cell] = {}
        details: dict[str, Details] = {}
        for eid in eids:
            cells[eid] = self.cell(eid)
            st = statuses.get(eid)
            if st is None:  # not started, or settled: no details to tell
                continue
            d = self._details(eid, st, full_details)
            if d is not None:
                details[eid] = d
        self._dirty = {}
        self._unannounced.clear()
        self._settle()
        agg_due = kind != "delta" or now - self._last_agg >= 1.0 / self.agg_hz - 1e-6  # float ticks: 0.7 - 0.2 < 0.5
        if not cells and not agg_due:
            return None
        agg = None
        if agg_due:
            self._last_agg = now
            agg = self.aggregate(now)
        msg = TelemetryMessage(FORMAT_VERSION, kind, self._seq, round(self.wall(), 3), self.run_name, cells, tasks,
                               details, agg)
        self._seq += 1
        return msg

    def aggregate(self, now: float | None = None) -> Aggregate:
        """The statistics pane's figures (see :class:`engine.telemetry.wire.Aggregate`)."""
        now = self.clock() if now is None else now
        stats = self.stats or RunStats(started_at=now)
        ops: Counter[str] = Counter()
        states: Counter[str] = Counter()
        for eid in self.tasks:  # in announce order, so that the counts come out the same every run
            state, op, _, _ = self.cell(eid)
            states[state] += 1
            if op and state == "R":
                ops[op] += 1
        done = stats.done
        self._sample_rates(now)
        steps_per_s, eps_per_s = self._steps_per_s, self._eps_per_s
        total = max(stats.total, len(self.tasks))
        remaining = total - done
        eta = remaining / eps_per_s if eps_per_s > 0 else (0.0 if remaining == 0 and total else None)
        workers: list[WorkerRow] = []
        in_flight = waiting = 0
        if self.pool is not None:
            cap_ops, cap_opens = self.pool.cfg.ops_per_worker, self.pool.cfg.opens_per_worker
            for h in list(self.pool.workers.values()):
                # Semaphore internals: in flight = capacity - value; waiters = the worker's FIFO queue.
                n_ops = cap_ops - h.ops._value
                n_wait = len(h.ops._waiters or ())
                in_flight += n_ops
                waiting += n_wait
                workers.append(WorkerRow(h.worker_id, h.alive, len(h.episodes), n_ops, n_wait,
                                         cap_opens - h.opens._value, h.browser_pss or None))  # None: no reading yet
        slots = self.policy_slots
        queues = Queues(
            policy_in_use=(self.policy_cap - slots._value) if slots is not None else ops["a"],
            policy_cap=self.policy_cap,
            policy_waiting=len(slots._waiters or ()) if slots is not None else 0,
            browser_in_flight=in_flight, browser_waiting=waiting,
            lease_waiting=states["W"],
            judge_pending=self.judge_pending() if self.judge_pending else 0)
        # The pool keeps the peak of the workers' reports (the run's stats copy it from there).
        pss_total, peak_pss = (self.pool.browser_pss, self.pool.peak_browser_pss) if self.pool is not None else (0, 0)
        return Aggregate(
            states=dict(states), ops=dict(ops), total=total, done=done, steps=stats.steps,
            outcomes=_outcomes(stats), success_rate=round(stats.success_rate, 4),
            steps_per_s=round(steps_per_s, 2), episodes_per_min=round(eps_per_s * 60, 2),
            spark=list(self._spark), phases=self._phases(now, stats),
            queues=queues, workers=workers, pss_total=pss_total,
            peak_pss=peak_pss, restarts=self.pool.restarts if self.pool else 0,
            elapsed_s=round(now - stats.started_at, 2), eta_s=None if eta is None else round(eta, 1))

    def _phases(self, now: float, stats: RunStats) -> dict[str, tuple[float, float, int]]:
        # Percentiles over windows of 2,000 samples cost ~0.1 ms per phase and move slowly: once per snapshot.
        if now - self._phases_at >= self.snapshot_s - 1e-6:
            self._phases_at = now
            self._phases_cache = stats.phase_percentiles()
        return self._phases_cache

    def _sample_rates(self, now: float) -> None:
        """Recent rates, sampled ``agg_hz`` times a second also with no monitor, so a late one gets a sparkline."""
        if now - self._last_rate < 1.0 / self.agg_hz - 1e-6 or self.stats is None:
            return
        self._last_rate = now
        steps, done = self.stats.steps, self.stats.done
        self._rates.append((now, steps, done))
        # Over the last ~10 s of samples: recent throughput, not the whole run's average.
        t0, s0, d0 = next(((t, s, d) for t, s, d in self._rates if now - t <= 10.0), self._rates[-1])
        dt = now - t0
        self._steps_per_s = (steps - s0) / dt if dt > 0 else 0.0
        self._eps_per_s = (done - d0) / dt if dt > 0 else 0.0
        self._spark.append(round(self._steps_per_s, 2))

    # --- the ticking task ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start ticking (call inside the running loop)."""
        if self._sock is not None and self._task is None:
            self._task = asyncio.ensure_future(self._tick_loop())

    def _poll_subscriptions(self) -> None:
        assert self._sock is not None
        while True:
            try:
                event = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            # XPUB_VERBOSE: b"\x01" for every subscriber that joins; b"\x00" only once the last one left.
            if event[:1] == b"\x01":
                self.subscribed = True
                self._want_full = True
            elif event[:1] == b"\x00":
                self.subscribed = False

    def _send(self, msg: TelemetryMessage) -> None:
        assert self._sock is not None
        try:
            self._sock.send(encode_message(msg), zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1  # a slow monitor: drop, never wait

    def tick(self) -> None:
        """One tick: hear subscriptions, then send what changed (nothing while no monitor is attached)."""
        self._poll_subscriptions()
        self._sample_rates(self.clock())
        if not self.subscribed:
            # A monitor that attaches gets a full snapshot: what changed meanwhile need not be remembered.
            self._dirty.clear()
            self._unannounced.clear()
            self._settle()
            return
        if self._want_full:
            self._want_full = False
            msg = self.message("snapshot", full_details=True)
        else:
            msg = self.message()
        if msg is not None:
            self._send(msg)

    async def _tick_loop(self) -> None:
        period = 1.0 / self.hz
        while True:
            t0, c0 = time.monotonic(), time.thread_time()
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a telemetry bug must never stop the run
                log.exception("telemetry tick failed")
            self.tick_cpu_s += time.thread_time() - c0  # what telemetry costs the engine's loop (bench/monitor.py)
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    async def close(self) -> None:
        """Send the final state and an end marker, stop ticking, close the socket."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # telemetry never fails a run
                await self._task
        self._task = None
        if self._sock is None:
            return
        self._poll_subscriptions()
        if self.subscribed:
            msg = self.message("snapshot", full_details=self._want_full)
            if msg is not None:
                self._send(msg)
            self._send(TelemetryMessage(FORMAT_VERSION, "end", self._seq, round(self.wall(), 3), self.run_name))
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                self._write_endpoint_file(ended_at=self.wall())
        sock, ctx = self._sock, self._ctx
        self._sock = self._ctx = None
        sock.close()
        assert ctx is not None
        if self._guard is not None:
            self._guard.stop()  # its ZAP socket would keep the context from terminating
            self._guard = None
        await asyncio.to_thread(ctx.term)  # waits up to LINGER for the last messages, off the loop
        if self.endpoint and self.endpoint.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(self.endpoint[len("ipc://"):])  # the run directory keeps only what it records
