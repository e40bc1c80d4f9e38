"""Chaos: a run whose browser workers keep failing while its task stream goes on. Does every task still end as
exactly one record, and what does the engine do about each failure?

The engine's worker socket and the bundled sites are on the host side of a veth pair (tcp, with CURVE keys made for
the run). ``--workers`` local workers are spawned by the pool; one more is started by hand
(``webgym-engine worker --connect``) inside a network namespace with a private /dev/shm (``bench/netns.py``,
``bench/remote_worker.py``): a worker on another host, whose frames come inline. A feeder keeps about two
concurrency's worth of episodes queued (the bundled tasks cycled, every one capped at ``--step-caps``) until
``--minutes`` have passed; then every record is waited for (at most ``--drain-timeout`` s: past it the run hangs).

Every 30-60 s (seeded), the chaos loop does one of: SIGKILL a random local worker process; SIGKILL a random worker's
Chromium (the remote one's included); cut the remote worker's link (its end of the veth pair down) for 5-30 s, then
restore it. The remote worker, when it exits, is started again (as a cluster manager would).

Reported: tasks submitted against the records of ``episodes.jsonl`` (missing, duplicated), retries and restarts,
every chaos event with what the engine did (the target leaving the pool, a worker joining, the pool's own events,
the episodes retried or failed), steps/s over time with the events marked, and what was left behind after the run:
processes, shared-memory segments, the namespace and its link.

    python -m bench.chaos [--minutes 20] [--workers 2] [--concurrency 32] [--seed 0] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import re
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.netns import NetNamespace, link_exists, namespaces, remove_stale
from bench.record_audit import audit_records
from bench.remote_worker import RemoteWorker
from bench.report import row, write_result
from bench.soak import soak_tasks
from browserpool.auth import create_keypair
from browserpool.instance import Instance
from browserpool.pool import WorkerHandle
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.core.gc_tuning import tune_for_engine_process
from engine.episode.rollout import Rollout
from engine.sites.server import SiteServer
from engine.store.records import EpisodeRecord
from engine.tasks.loading import load_tasks
from policy.registry import make_policy

ACTIONS = ("kill_worker", "kill_browser", "cut_link")
REMOTE_ID = "remote"
REJOIN_WINDOW_S = 120.0  # a worker joining this long after the target left counts as its replacement


@dataclass
class ChaosEvent:
    """One act of the chaos loop (times in seconds from the start of the run)."""

    t: float
    action: str
    target: str  # the worker as the engine names it
    pid: int = 0
    cut_s: float | None = None
    restored_t: float | None = None
    outcome: dict[str, Any] = field(default_factory=dict)  # what the engine did (filled in after the run)


class Timeline:
    """What happened when: the pool's membership and events, steps and records over time, and every record that
    carries an error (its own or a retried attempt's)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.t0 = time.monotonic()
        self.members: list[dict[str, Any]] = []  # {"t", "worker", "change": joined|left, "remote"}
        self.pool_events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []  # {"t", "steps", "records", "alive"}
        self.troubled: list[dict[str, Any]] = []  # records with an error or a retried attempt
        self.records = 0
        self.record_event = asyncio.Event()
        self._alive: set[str] = set()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def on_pool_event(self, kind: str, message: str) -> None:
        self.pool_events.append({"t": self.now(), "kind": kind, "message": message[:300]})

    def on_record(self, _rollout: Rollout, record: EpisodeRecord) -> None:
        self.records += 1
        self.record_event.set()
        if record.get("error") or record.get("previous_errors"):
            self.troubled.append({"t": self.now(), "episode_id": record["episode_id"], "status": record["status"],
                                  "worker": record.get("worker"), "attempts": record.get("attempts"),
                                  "error": record.get("error"), "previous_errors": record.get("previous_errors")})

    def poll(self) -> None:
        """Note joins and departures since the last call, and one sample of steps and records."""
        handles = {h.worker_id: h for h in self.core.pool.alive_workers()}
        for wid in sorted(set(handles) - self._alive):
            self.members.append({"t": self.now(), "worker": wid, "change": "joined",
                                 "remote": handles[wid].proc is None})
        for wid in sorted(self._alive - set(handles)):
            self.members.append({"t": self.now(), "worker": wid, "change": "left"})
        self._alive = set(handles)
        self.samples.append({"t": self.now(), "steps": self.core.stats.steps, "records": self.records,
                             "alive": len(handles)})

    async def watch(self, interval: float) -> None:
        while True:
            self.poll()
            await asyncio.sleep(interval)


def remote_handle(core: EngineCore, remote: RemoteWorker) -> WorkerHandle | None:
    """The pool's live handle of the remote worker's current process (the pool names each joining remote, remote-7,
    ...; a handle whose process has exited stays alive until its heartbeats are missed)."""
    pid = remote.worker_pid()
    return next((h for h in core.pool.alive_workers() if h.proc is None and pid and h.pid == pid), None)


class Chaos:
    """The chaos loop and the remote worker's supervisor."""

    def __init__(self, core: EngineCore, ns: NetNamespace, remote: RemoteWorker, timeline: Timeline,
                 args: argparse.Namespace) -> None:
        self.core, self.ns, self.remote, self.timeline, self.args = core, ns, remote, timeline, args
        self.rng = random.Random(args.seed)
        self.events: list[ChaosEvent] = []
        self.remote_exits: list[dict[str, Any]] = []
        self.link_down = False

    def _choices(self) -> list[str]:
        """The actions that can be done now (a link cut needs the remote worker in the pool)."""
        return [a for a in self.args.actions if a != "cut_link" or remote_handle(self.core, self.remote) is not None]

    async def run(self, deadline: float) -> None:
        """Act every ``gap`` seconds (seeded) until ``deadline`` (monotonic)."""
        while True:
            gap = self.rng.uniform(self.args.min_gap, self.args.max_gap)
            if time.monotonic() + gap >= deadline:
                return
            await asyncio.sleep(gap)  # the chaos schedule itself, not a wait for the engine
            choices = self._choices()
            if choices:
                await self.act(self.rng.choice(choices))

    async def act(self, action: str) -> None:
        t = self.timeline.now()
        local = sorted((h for h in self.core.pool.alive_workers() if h.proc is not None), key=lambda h: h.worker_id)
        if action == "kill_worker" and local:
            h = self.rng.choice(local)
            self._kill(h.pid)
            self.events.append(ChaosEvent(t, action, h.worker_id, h.pid))
        elif action == "kill_browser":
            targets = [(h.worker_id, h.browser_pid) for h in local if h.browser_pid]
            remote = remote_handle(self.core, self.remote)
            if remote is not None and (bpid := self.remote.browser_pid()):
                targets.append((remote.worker_id, bpid))
            if targets:
                wid, pid = self.rng.choice(targets)
                self._kill(pid)
                self.events.append(ChaosEvent(t, action, wid, pid))
        elif action == "cut_link" and (remote := remote_handle(self.core, self.remote)) is not None:
            cut_s = round(self.rng.uniform(self.args.min_cut, self.args.max_cut), 1)
            event = ChaosEvent(t, action, remote.worker_id, self.remote.worker_pid(), cut_s=cut_s)
            self.events.append(event)
            self.ns.cut()
            self.link_down = True
            try:
                await asyncio.sleep(cut_s)  # how long the link stays down
            finally:
                self.ns.restore()
                self.link_down = False
            event.restored_t = self.timeline.now()
        if self.events and self.events[-1].t == t:
            e = self.events[-1]
            print(f"  [{t:7.1f} s] {e.action} {e.target}" + (f" for {e.cut_s:g} s" if e.cut_s else ""), flush=True)

    @staticmethod
    def _kill(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    async def supervise_remote(self, interval: float = 1.0) -> None:
        """Start the remote worker again whenever it has exited (a cluster manager's job)."""
        while True:
            await asyncio.sleep(interval)
            code = self.remote.exited()
            if code is not None:
                self.remote_exits.append({"t": self.timeline.now(), "exit_code": code})
                self.remote.start()


class Feeder:
    """Keeps about ``backlog`` episodes without a record in the engine until ``deadline``: the bundled tasks, cycled
    (each task's next sample, so that every episode id is new)."""

    def __init__(self, core: EngineCore, policy: Any, tasks: list[Any], timeline: Timeline, backlog: int) -> None:
        self.core, self.tasks, self.timeline, self.backlog = core, tasks, timeline, backlog
        self.ctx = core.context(policy)
        self.rollouts: list[Rollout] = []
        self._next = 0

    async def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            need = self.backlog - (len(self.rollouts) - self.timeline.records)
            if need > 0:
                batch = [(self.tasks[(self._next + i) % len(self.tasks)], None) for i in range(need)]
                self._next += need
                self.rollouts += self.core.submit(self.ctx, batch)
            self.timeline.record_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.timeline.record_event.wait(), max(0.0, deadline - time.monotonic()))


WORKER_REF = r"worker {}(?![\w.-])"


def _mentions(record: dict[str, Any], worker: str) -> tuple[bool, bool]:
    """Whether the record's final error, and whether one of its retried attempts' errors, names ``worker``."""
    pattern = re.compile(WORKER_REF.format(re.escape(worker)))
    final = bool(record["error"]) and bool(pattern.search(record["error"].get("message", "")))
    earlier = any(pattern.search(e.get("message", "")) for e in record["previous_errors"] or [])
    return final, earlier


def annotate(events: list[ChaosEvent], timeline: Timeline, end_t: float) -> None:
    """What the engine did after each event, until the next one: whether and when the target left the pool and a
    worker joined, the pool's events, and the episodes that lost an attempt on the target: retried, or ended with an
    error record. The pool names every worker that joins anew (w3, remote-7), and one worker leaves the pool at most
    once, so an episode's error that names the worker belongs to the event after which it left."""
    for i, ev in enumerate(events):
        # The target's departure is this event's doing unless a later event hit the same worker first.
        until = next((e.t for e in events[i + 1:] if e.target == ev.target), math.inf)
        left = next((m["t"] for m in timeline.members
                     if m["change"] == "left" and m["worker"] == ev.target and ev.t <= m["t"] < until), None)
        joined = next((m for m in timeline.members if m["change"] == "joined" and left is not None
                       and left <= m["t"] < left + REJOIN_WINDOW_S
                       and m.get("remote") == ev.target.startswith(REMOTE_ID)), None)
        next_t = events[i + 1].t if i + 1 < len(events) else end_t + REJOIN_WINDOW_S
        retried = failed = 0
        kinds: dict[str, int] = {}
        for rec in timeline.troubled if left is not None else []:
            final, earlier = _mentions(rec, ev.target)
            if final:
                failed += 1
                kinds[rec["error"]["kind"]] = kinds.get(rec["error"]["kind"], 0) + 1
            elif earlier:
                retried += 1
        ev.outcome = {
            "left_after_s": None if left is None else round(left - ev.t, 2),
            "joined": None if joined is None else joined["worker"],
            "joined_after_s": None if joined is None else round(joined["t"] - ev.t, 2),
            "episodes_retried": retried, "episodes_failed": failed, "failed_kinds": kinds,
            "pool_events": [e for e in timeline.pool_events if ev.t <= e["t"] < next_t][:12],
        }


def leftovers(engine_pid: int, sites_stopped: bool) -> dict[str, Any]:
    """What this run left behind: child processes, shared-memory segments named after this engine, its temporary
    directories."""
    children = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(proc.cmdline())
            # Python's own shared-memory resource tracker serves this process until it exits: not the run's.
            if "resource_tracker" not in cmd and (sites_stopped or "engine.sites.server" not in cmd):
                children.append(f"{proc.pid} {cmd[:120]}")
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(f"wg-{engine_pid}-")]
    tmp = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(Instance.current().tmp_prefix())]
    return {"processes": children, "shm_segments": shm, "tmp_dirs": tmp}


def rate_series(samples: list[dict[str, Any]], window_s: float) -> list[tuple[float, float]]:
    """(time, steps/s over the last ``window_s``) at every sample from ``window_s`` on (a full window behind it)."""
    out = []
    j = 0
    for s in samples:
        while samples[j]["t"] < s["t"] - window_s:
            j += 1
        a = samples[j]
        if s["t"] >= window_s and s["t"] > a["t"]:
            out.append((s["t"], (s["steps"] - a["steps"]) / (s["t"] - a["t"])))
    return out


async def chaos_run(args: argparse.Namespace, ns: NetNamespace, work: Path) -> dict[str, Any]:
    """The run itself (the namespace is made and removed by the caller)."""
    keys = work / "keys"
    create_keypair(keys, "engine")
    create_keypair(keys, REMOTE_ID)
    (work / "allowed").mkdir()
    shutil.copy(keys / f"{REMOTE_ID}.key", work / "allowed" / f"{REMOTE_ID}.key")
    with SiteServer(host=ns.host_addr) as sites:
        tasks_file = soak_tasks(work / "tasks.jsonl", keep_task_caps=False)
        tasks = load_tasks(tasks_file, sites.base_url)
        cfg = RunConfig(tasks=str(tasks_file), concurrency=args.concurrency, workers=args.workers,
                        step_caps=args.step_caps, retry_lost=args.retry_lost, output_dir=str(work / "runs"),
                        listen=f"tcp://{ns.host_addr}:0", server_key=str(keys / "engine.key_secret"),
                        allow_keys=str(work / "allowed"))
        core = EngineCore(cfg, base_url=sites.base_url)
        timeline = Timeline(core)
        core.on_record(timeline.on_record)
        remote: RemoteWorker | None = None
        background: list[asyncio.Task[None]] = []
        drained = True
        drain_s = 0.0
        remote_exit: int | None = None
        try:
            run_dir = await core.start({"benchmark": "chaos", "policy": args.policy})
            core.pool.on_event = timeline.on_pool_event
            remote = RemoteWorker(ns, core.pool.endpoint, REMOTE_ID, keys / "engine.key",
                                  keys / f"{REMOTE_ID}.key_secret", work)
            remote.start()
            await core.pool.wait_for_workers(args.workers + 1, 120)
            policy = make_policy(args.policy)
            await core.start_policy(policy)
            core.stats.restart_clock()
            timeline.t0 = time.monotonic()
            deadline = time.monotonic() + 60 * args.minutes
            chaos = Chaos(core, ns, remote, timeline, args)
            feeder = Feeder(core, policy, tasks, timeline, 2 * args.concurrency)
            background = [asyncio.ensure_future(timeline.watch(args.sample_s)),
                          asyncio.ensure_future(chaos.supervise_remote())]
            print(f"chaos: {args.minutes:g} min, {args.workers} local workers and 1 remote ({ns.name}), "
                  f"engine at {core.pool.endpoint}", flush=True)
            await asyncio.gather(feeder.run(deadline), chaos.run(deadline))
            end_feed = timeline.now()
            t_drain = time.monotonic()
            try:
                await asyncio.wait_for(core.wait(feeder.rollouts), args.drain_timeout)
            except TimeoutError:
                drained = False
            drain_s = time.monotonic() - t_drain
            timeline.poll()
            hung = [{"episode_id": r.episode_id, "state": r.status.state.name, "attempts": r.attempts}
                    for r in feeder.rollouts if not r.finished]
            stats = core.stats.summary()
            restarts = core.pool.restarts
            offences = {k.hex(): v for k, v in core.pool.offences.items()}
            dropped = core.pool.dropped_messages
        finally:
            for task in background:
                task.cancel()
            await core.close()
            if remote is not None:
                remote_exit = remote.stop(timeout=30)
        engine_pid = os.getpid()
        audit = audit_records(run_dir, [r.episode_id for r in feeder.rollouts])
    left = leftovers(engine_pid, sites_stopped=True)
    left["in_namespace"] = ns.pids()  # before the namespace is removed: a worker that never exited
    left["remote_tmp"] = remote.leftovers() if remote is not None else []
    remote_log = remote.log_path.read_text(errors="replace").splitlines()[-60:] if remote is not None else []
    annotate(chaos.events, timeline, end_feed)
    return {"events": [asdict(e) for e in chaos.events], "timeline": timeline, "audit": audit, "stats": stats,
            "restarts": restarts, "remote_starts": remote.starts if remote else 0,
            "remote_exits": chaos.remote_exits, "remote_exit_at_close": remote_exit, "drained": drained,
            "drain_s": round(drain_s, 1), "hung": hung[:50], "hung_count": len(hung), "feed_s": end_feed,
            "offences": offences, "dropped_messages": dropped, "leftovers": left, "remote_log_tail": remote_log}


def plot(path: Path, res: dict[str, Any], window_s: float) -> Path:
    """steps/s over time (and the live workers) with the chaos events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl: Timeline = res["timeline"]
    colors = {"kill_worker": "tab:red", "kill_browser": "tab:orange", "cut_link": "tab:purple"}
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 5.5), dpi=100, sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    rate = rate_series(tl.samples, window_s)
    ax.plot([t / 60 for t, _ in rate], [r for _, r in rate], color="tab:green", lw=1.1,
            label=f"steps/s ({window_s:g} s window)")
    ax2.step([s["t"] / 60 for s in tl.samples], [s["alive"] for s in tl.samples], where="post", color="tab:blue")
    seen: set[str] = set()
    for e in res["events"]:
        label = e["action"].replace("_", " ") if e["action"] not in seen else None
        seen.add(e["action"])
        for a in (ax, ax2):
            if e["action"] == "cut_link" and e["restored_t"] is not None:
                a.axvspan(e["t"] / 60, e["restored_t"] / 60, color=colors["cut_link"], alpha=0.15,
                          label=label if a is ax else None)
            else:
                a.axvline(e["t"] / 60, color=colors[e["action"]], lw=0.9, ls="--", label=label if a is ax else None)
    ax.axvline(res["feed_s"] / 60, color="black", lw=0.8, label="task stream ends")
    ax.set_ylabel("steps/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    ax.set_title(f"Chaos: {len(res['events'])} events over {res['feed_s'] / 60:.1f} min; "
                 f"{res['audit']['records']:,} records for {res['audit']['started']:,} tasks", fontsize=10)
    ax2.set_ylabel("live workers")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    audit, stats, left = res["audit"], res["stats"], res["leftovers"]
    counts = {a: sum(e["action"] == a for e in res["events"]) for a in ACTIONS}
    retried = sum(1 for rec in res["timeline"].troubled if rec["previous_errors"])
    engine_left = sum(len(left[k]) for k in ("processes", "shm_segments", "tmp_dirs", "in_namespace"))
    rates = [r for t, r in rate_series(res["timeline"].samples, 30.0) if t <= res["feed_s"]]
    return [
        row("duration of the task stream", res["feed_s"] / 60, "min"),
        row("tasks submitted", audit["started"], "tasks"),
        row("records written", audit["records"], "records", f"= tasks submitted ({audit['started']:,})",
            audit["records"] == audit["started"]),
        row("tasks without a record", audit["missing"], "tasks", "0", audit["missing"] == 0),
        row("tasks with more than one record", audit["duplicated"], "tasks", "0", audit["duplicated"] == 0),
        row("time to the last record after the stream ended", res["drain_s"], "s", "every record, no hang",
            res["drained"]),
        row("chaos events", len(res["events"]), "events"),
        *(row(f"chaos events: {a.replace('_', ' ')}", counts[a], "events") for a in ACTIONS),
        row("local worker restarts (pool)", res["restarts"], "restarts"),
        row("remote worker restarts (by the harness, after it exited)", max(0, res["remote_starts"] - 1), "restarts"),
        row("episodes retried after a lost worker", retried, "episodes"),
        row("error records", audit["statuses"].get("error", 0), "records"),
        row("steps/s over the run", stats["steps_per_s"], "steps/s"),
        row("steps/s, lowest 30 s window", min(rates) if rates else 0.0, "steps/s"),
        row("left behind after the run: processes, shared-memory segments, temp dirs", engine_left, "items", "0",
            engine_left == 0),
        row("left behind by the remote worker in its temp dir", len(left["remote_tmp"]), "items", "0",
            not left["remote_tmp"]),
        row("namespace and veth link left after cleanup", res["ns_left"], "items", "0", res["ns_left"] == 0),
    ]


def notes(res: dict[str, Any], args: argparse.Namespace) -> list[str]:
    audit = res["audit"]
    out = [f"{args.workers} local workers and 1 remote worker (a network namespace joined by a veth pair, CURVE, "
           f"frames inline); concurrency {args.concurrency}; the {args.policy} policy on the bundled tasks capped at "
           f"{','.join(map(str, args.step_caps))} steps; --retry-lost {args.retry_lost}; a chaos event every "
           f"{args.min_gap:g}-{args.max_gap:g} s (seed {args.seed}); link cuts of {args.min_cut:g}-{args.max_cut:g} s.",
           f"Outcomes: {audit['statuses']}; error kinds: {audit['error_kinds'] or 'none'}; retried attempts by "
           f"cause: {audit['retries_by_kind'] or 'none'}."]
    if not res["drained"]:
        out.append(f"HANG: {res['hung_count']} episodes had no record {args.drain_timeout:g} s after the stream "
                   f"ended: {res['hung'][:5]}")
    if res["leftovers"]["remote_tmp"]:
        out.append("The remote worker's temp dir kept what its killed browsers left there "
                   f"({', '.join(res['leftovers']['remote_tmp'][:4])}): a worker started by hand has no private temp "
                   "dir of its own, unlike the pool's workers, whose dir goes when they exit.")
    if res["offences"]:
        out.append(f"The pool counted bad messages from peers: {res['offences']} ({res['dropped_messages']} dropped).")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="how long the task stream and the chaos go on")
    ap.add_argument("--workers", type=int, default=2, help="local workers (one remote worker besides)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--policy", default="instant", choices=["instant", "scripted"])
    ap.add_argument("--step-caps", type=lambda s: tuple(int(x) for x in s.split(",")), default=(3, 3, 3))
    ap.add_argument("--retry-lost", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--actions", nargs="+", choices=ACTIONS, default=list(ACTIONS), help="what the chaos loop may do")
    ap.add_argument("--min-gap", type=float, default=30.0, help="seconds between chaos events, at least")
    ap.add_argument("--max-gap", type=float, default=60.0)
    ap.add_argument("--min-cut", type=float, default=5.0, help="seconds a link cut lasts, at least")
    ap.add_argument("--max-cut", type=float, default=30.0)
    ap.add_argument("--sample-s", type=float, default=1.0, help="seconds between timeline samples")
    ap.add_argument("--drain-timeout", type=float, default=600.0,
                    help="seconds to wait for the last records once the stream ends (past it: a hang)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args(argv)
    import uvloop

    if os.geteuid() != 0:
        ap.error("the chaos benchmark makes a network namespace: run it as root")
    stale = remove_stale()
    if stale:
        print(f"removed namespaces of chaos runs that no longer run: {stale}")
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp, NetNamespace.create() as ns:
        previous = signal.signal(signal.SIGTERM, _interrupt)  # cleaned up like Ctrl-C
        try:
            tune_for_engine_process()  # as webgym-engine run does
            res = uvloop.run(chaos_run(args, ns, Path(tmp)))
        finally:
            signal.signal(signal.SIGTERM, previous)
    res["ns_left"] = int(ns.name in namespaces()) + int(link_exists(ns.host_if))
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(args.out / "chaos.png", res, 10.0)
    rows = summary_rows(res)
    tl: Timeline = res.pop("timeline")
    config = {k: v for k, v in vars(args).items() if k != "out"}
    write_result(args.out / "chaos.json", "chaos", config, rows, [png.name], notes(res, args), **res,
                 membership=tl.members, pool_events=tl.pool_events, troubled_records=tl.troubled,
                 samples=tl.samples)
    for r in rows:
        met = "" if r["met"] is None else ("  met" if r["met"] else "  MISSED")
        print(f"{r['figure']:72s} {r['value']:>10,.2f} {r['unit']}{met}")
    ok = res["audit"]["exactly_one_each"] and res["drained"]
    return 0 if ok else 1


def _interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
