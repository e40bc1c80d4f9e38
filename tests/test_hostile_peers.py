"""Peers that send garbage, wrongly shaped or typed, oversized or forged messages to the engine's worker socket,
and a peer that heartbeats but never answers: a run of bundled tasks still ends with every episode recorded.

Real sockets throughout: the engine listens on loopback tcp (insecure, so that any local peer can reach it, as
an attacker on the network could without CURVE), the attackers are plain pyzmq sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from browserpool import protocol as P
from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool, PoolConfig, PoolError
from engine.clients.runner import load_task_source, plan_episodes, run
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.store.run_dir import RunStore, read_records
from policy.registry import make_policy
from tests.conftest import subset

pytestmark = pytest.mark.asyncio(loop_scope="session")


def hello(worker_id: str, **kw: Any) -> P.Hello:
    fields: dict[str, Any] = dict(worker_id=worker_id, pid=os.getpid(), hostname="elsewhere", browser_pid=1,
                                  browser_version="x", shm_name=None, slot_count=0, slot_size=0)
    fields.update(kw)
    return P.Hello(**fields)


async def attack(endpoint: str) -> dict[str, int]:
    """Every kind of bad message, from several peers; returns what was sent."""
    ctx = zmq.asyncio.Context()
    sent: dict[str, int] = {}
    socks: list[zmq.asyncio.Socket] = []

    def sock(kind: int) -> zmq.asyncio.Socket:
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
        return s

    try:
        garbage = sock(zmq.DEALER)
        for data in (b"", b"\xc1", b"not msgpack \xff", msgpack.packb(["nope", 1]), msgpack.packb({"a": 1}),
                     msgpack.packb(["rep", 1, True, None, None, None]),  # a reply before any hello
                     # a reply whose body nests 100,000 deep
                     b"\x96\xa3rep\x01\xc3" + b"\x91" * 100_000 + b"\xc0\xc0\xc0"):
            await garbage.send(data)
        sent["garbage"] = 7
        # A REQ socket sends two frames (an empty delimiter, then the payload).
        req = sock(zmq.REQ)
        await req.send(P.encode(hello("req-peer")))
        sent["two_frames"] = 1
        multi = sock(zmq.DEALER)
        await multi.send_multipart([b"a", b"b", b"c"])
        sent["three_frames"] = 1
        # Hellos whose fields have the wrong types, or that name shared memory outside the engine's scheme.
        typed = sock(zmq.DEALER)
        for wire in (["hello", "w0", "pid", "h", 1, "v", None, 1, 1],
                     ["hello", "a/b", 1, "h", 1, "v", None, 1, 1],
                     ["hello", "w0", 1, "h", 1, "v", None, 1, 1, "protocol", "extra"]):
            await typed.send(msgpack.packb(wire))
        sent["wrong_types"] = 3
        # Forged: claims the spawned worker's id and a shared-memory name with a path in it, then sends replies
        # to requests it never got and heartbeats in another worker's name.
        forged = sock(zmq.DEALER)
        await forged.send(P.encode(hello("w0", shm_name="a/b", slot_count=4, slot_size=1024)))
        for req_id in range(1, 40):
            await forged.send(P.encode(P.Reply(req_id, True, ["x"])))
        await forged.send(P.encode(P.Heartbeat("someone-else", 0, 0)))
        sent["forged"] = 41
        # Oversized: ZeroMQ drops it (MAXMSGSIZE) and closes that connection; Python never sees it.
        big = sock(zmq.DEALER)
        await big.send(b"\x00" * (P.MAX_MESSAGE_BYTES + 1))
        sent["oversized"] = 1
        await asyncio.sleep(0.5)  # let the engine read all of it while its episodes run
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return sent


async def test_hostile_messages_leave_a_run_complete(tmp_path: Path, sites: str) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1,
                    listen="tcp://127.0.0.1:0", insecure=True, telemetry=None)
    events: list[tuple[str, str]] = []
    attacks: list[asyncio.Task[dict[str, int]]] = []

    pools: list[BrowserPool] = []

    def on_start(core: EngineCore, run_dir: Path) -> None:
        pools.append(core.pool)
        core.pool.on_event = lambda kind, msg: events.append((kind, msg))
        attacks.append(asyncio.ensure_future(attack(core.pool.endpoint)))

    stats, run_dir = await run(cfg, make_policy("scripted"), sites, on_start=on_start)
    await attacks[0]
    records = read_records(run_dir)
    assert len(records) == n and len({r["episode_id"] for r in records}) == n
    assert {r["status"] for r in records} == {"success"}, [r.get("error") for r in records]
    assert stats.summary()["lost"] == 0
    kinds = {kind for kind, _ in events}
    assert "protocol" in kinds, events  # each bad message was dropped and said so
    dropped = [m for kind, m in events if kind == "protocol" and "dropped a bad message" in m]
    assert len(dropped) >= 10, dropped
    # The forged hello registered as a new hand-started worker, never as the spawned "w0", and mapped no memory.
    forged = [h for h in pools[0].workers.values() if h.shm_name == "a/b"]
    assert forged and all(h.proc is None and h.reader is None and h.worker_id != "w0" for h in forged)
    assert pools[0].workers["w0"].proc is not None


async def test_a_peer_that_bans_itself_is_ignored(sites: str) -> None:
    """After max_offences bad messages a peer is banned: later messages, even valid ones, are not looked at."""
    pool = BrowserPool(PoolConfig(workers=1, listen="tcp://127.0.0.1:0", insecure=True, max_offences=3))
    await pool.start()
    ctx = zmq.asyncio.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    try:
        peer.connect(pool.endpoint)
        for _ in range(3):
            await peer.send(b"\xc1")
        await peer.send(P.encode(hello("late-joiner")))
        for _ in range(100):
            if pool.dropped_messages >= 4:
                break
            await asyncio.sleep(0.02)
        assert pool.dropped_messages >= 4
        assert [h.worker_id for h in pool.alive_workers()] == ["w0"]  # the hello after the ban was ignored
        # The spawned worker still serves.
        session = await pool.lease("e1")
        obs, frame = await session.open(sites + "/wiki/")
        frame.release()
        assert obs.url.startswith(sites)
        await session.close()
    finally:
        peer.close(0)
        ctx.term()
        await pool.close()


class SilentWorker:
    """A peer that says a valid hello and heartbeats, but never answers a request."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.requests = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.sock.send(P.encode(hello("silent")))
        self._tasks = [asyncio.ensure_future(self._beat()), asyncio.ensure_future(self._swallow())]

    async def _beat(self) -> None:
        while True:
            await self.sock.send(P.encode(P.Heartbeat("silent", 0, 0)))
            await asyncio.sleep(0.5)

    async def _swallow(self) -> None:
        while True:
            msg = P.decode_from_engine(await self.sock.recv())
            self.requests += isinstance(msg, P.Request)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.sock.close(0)
        self.ctx.term()


async def test_a_worker_that_never_answers_costs_only_its_episodes(tmp_path: Path, sites: str) -> None:
    tasks = subset(tmp_path, per_site=1)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1,
                    telemetry=None, retry_lost=2)
    # Short worker caps make short request deadlines: 4 s open + 2 x 2 s screenshot + 1 s slack = 9 s.
    worker = WorkerConfig(endpoint="", open_timeout_s=4, settle_timeout_s=4, screenshot_timeout_s=2)
    pool = BrowserPool(PoolConfig(workers=1, listen="tcp://127.0.0.1:0", insecure=True, worker=worker,
                                  request_slack_s=1, max_timeouts=2, start_timeout_s=60))
    await pool.start()
    silent = SilentWorker(pool.endpoint)
    await silent.start()
    events: list[tuple[str, str]] = []
    pool.on_event = lambda kind, msg: events.append((kind, msg))
    try:
        await pool.wait_for_workers(2, 10)
        plan = plan_episodes(load_task_source(cfg.tasks, sites), None, set())
        store = RunStore(tmp_path / "run")
        core = EngineCore(cfg, pool=pool, store=store)
        await core.start()
        try:
            stats = await asyncio.wait_for(core.run_plan(make_policy("scripted"), plan), 240)
        finally:
            await core.close()
            store.close()
    finally:
        await silent.close()
        await pool.close()
    records = read_records(tmp_path / "run")
    assert len(records) == len(plan) and stats.summary()["lost"] == 0
    assert silent.requests >= 1  # the silent worker did get episodes...
    assert any(kind == "worker_dropped" and "silent" in m for kind, m in events), events  # ...and was dropped
    # Its episodes were retried on the real worker (or, at worst, ended with an error record): none hung.
    assert {r["status"] for r in records} <= {"success", "error"}
    assert sum(r["status"] == "success" for r in records) >= len(plan) - 1, json.dumps(records)[:2000]


async def test_a_broken_receive_loop_fails_the_run_loudly(tmp_path: Path, sites: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Not input but the socket itself fails: every episode still gets its record, then the run raises."""
    tasks = subset(tmp_path, per_site=1)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    pool = BrowserPool(PoolConfig(workers=1))
    await pool.start()
    store = RunStore(tmp_path / "run")
    try:
        plan = plan_episodes(load_task_source(cfg.tasks, sites), None, set())
        core = EngineCore(cfg, pool=pool, store=store)
        await core.start()
        # The next receive fails as a broken socket would; the loop must not die silently.
        original = zmq.Socket.recv

        def broken(self: zmq.Socket, *a: Any, **kw: Any) -> Any:  # type: ignore[type-arg]
            if self is pool._router.sock:
                raise zmq.ZMQError(zmq.EFAULT, "simulated socket failure")
            return original(self, *a, **kw)

        monkeypatch.setattr(zmq.Socket, "recv", broken)
        # Wake the loop: it is waiting in a receive that began before the patch; a heartbeat completes it.
        with pytest.raises(PoolError, match="simulated socket failure"):
            await asyncio.wait_for(core.run_plan(make_policy("scripted"), plan), 120)
        await core.close()
    finally:
        store.close()
        await pool.close()
    records = read_records(tmp_path / "run")
    assert len(records) == len(plan) and {r["status"] for r in records} == {"error"}
