"""Workers started by hand (`webgym-engine worker --connect`) join an engine over tcp: with CURVE keys by
default, without them only when both sides say --insecure; a worker whose key is not allowed is refused."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import psutil
import pytest
import zmq
import zmq.asyncio

from browserpool.auth import ClientKeys, KeyFileError, ServerKeys
from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool, PoolConfig, PoolError, WorkerLost
from browserpool.protocol import HANDSHAKE_TIMEOUT_MS, BrowserAction, NetSettings
from engine._imgcodec import jpeg_size
from engine.telemetry.publisher import TelemetryPublisher
from tests.conftest import until

pytestmark = pytest.mark.asyncio(loop_scope="session")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keys/engine.key(_secret), keys/w1.key(_secret), keys/stranger.key(_secret); allowed/ holds w1.key only."""
    d = tmp_path_factory.mktemp("curve")
    for name in ("engine", "w1", "stranger"):
        res = cli("keys", name, "--dir", str(d / "keys"))
        assert res.returncode == 0, res.stderr
    (d / "allowed").mkdir()
    shutil.copy(d / "keys" / "w1.key", d / "allowed" / "w1.key")
    return d


def start_worker(endpoint: str, worker_id: str, *extra: str, tmp: Path | None = None) -> subprocess.Popen[bytes]:
    # No network-policy flags: a worker started by hand takes the engine's policy (and its sites) from Welcome.
    env = {**os.environ, "TMPDIR": str(tmp)} if tmp is not None else None
    return subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--connect", endpoint,
                             "--worker-id", worker_id, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)


async def started(pool: BrowserPool) -> asyncio.Future[None]:
    """Start the pool in the background; return once its socket is bound."""
    starting = asyncio.ensure_future(pool.start())
    while not pool.endpoint and not starting.done():
        await asyncio.sleep(0.01)
    if starting.done():
        starting.result()  # raises what start raised
    return starting


async def serve_one_episode(pool: BrowserPool, url: str, inline: bool) -> None:
    session = await pool.lease("e1")
    obs, frame = await session.open(url)
    with frame:
        assert jpeg_size(frame.view) == (1280, 768)
    assert (obs.frame is None) == inline and (obs.frame_bytes is not None) == inline
    obs, frame = await session.act(BrowserAction("scroll", direction="down"))
    frame.release()
    assert obs.settled and obs.url.endswith("/wiki/")
    await session.close()


async def test_key_files_are_private(keys: Path) -> None:
    for f in (keys / "keys").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stat.S_IMODE((keys / "keys").stat().st_mode) == 0o700
    res = cli("keys", "w1", "--dir", str(keys / "keys"))
    assert res.returncode != 0 and "exists" in res.stderr  # a key is never overwritten


async def test_curve_worker_serves_episodes_and_a_stranger_is_refused(site_server: str, keys: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    events: list[tuple[str, str]] = []
    server = ServerKeys.load(keys / "keys" / "engine.key_secret", keys / "allowed")
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0", shared_memory=False,
                                  start_timeout_s=60, server_keys=server))
    pool.on_event = lambda kind, msg: events.append((kind, msg))
    starting = await started(pool)
    k = keys / "keys"
    stranger = start_worker(pool.endpoint, "stranger", "--server-key", str(k / "engine.key"),
                            "--key", str(k / "stranger.key_secret"))
    good = start_worker(pool.endpoint, "remote-1", "--server-key", str(k / "engine.key"),
                        "--key", str(k / "w1.key_secret"))
    try:
        await starting
        [handle] = pool.alive_workers()
        assert handle.worker_id == "remote-1" and handle.public_key is not None
        await serve_one_episode(pool, site_server + "/wiki/", inline=True)
        for _ in range(100):  # the stranger's handshake may still be under way
            if any(kind == "auth" for kind, _ in events):
                break
            await asyncio.sleep(0.05)
        refused = [m for kind, m in events if kind == "auth"]
        assert refused and "not in the allow-list" in refused[0]
        # ...and in the log, which the command line shows: before, nothing told the user why a worker never joined.
        logged = [r for r in caplog.records if r.name == "browserpool.pool" and r.levelname == "WARNING"]
        assert any(refused[0] in r.getMessage() for r in logged), [r.getMessage() for r in logged]
        assert [h.worker_id for h in pool.alive_workers()] == ["remote-1"]  # the stranger never joined
    finally:
        await pool.close()
        stranger.kill()
        stranger.wait(timeout=30)
        assert good.wait(timeout=30) == 0, good.stderr.read().decode()[-2000:] if good.stderr else ""


async def test_spawned_workers_join_a_curve_socket_with_the_pools_own_key(site_server: str, keys: Path) -> None:
    server = ServerKeys.load(keys / "keys" / "engine.key_secret", keys / "allowed")
    pool = BrowserPool(PoolConfig(workers=1, listen="tcp://127.0.0.1:0", server_keys=server))
    await pool.start()
    try:
        [handle] = pool.alive_workers()
        assert handle.proc is not None and handle.public_key is not None
        assert handle.public_key not in server.allowed  # an ephemeral key, never written anywhere
        await serve_one_episode(pool, site_server + "/wiki/", inline=False)
    finally:
        await pool.close()


@pytest.mark.parametrize("shared_memory", [True, False])
async def test_insecure_tcp_worker(site_server: str, shared_memory: bool) -> None:
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0", insecure=True,
                                  shared_memory=shared_memory, start_timeout_s=60))
    starting = await started(pool)
    proc = start_worker(pool.endpoint, "remote-1", "--insecure")
    try:
        await starting
        [handle] = pool.alive_workers()
        # A worker the pool did not spawn never has its process ids used, and maps no ring it did not name
        # under the engine's scheme (a hand-started worker's own ring is mapped read-only, never unlinked).
        assert handle.worker_id == "remote-1" and handle.browser_pid == 0
        assert (handle.reader is not None) == shared_memory
        await serve_one_episode(pool, site_server + "/wiki/", inline=not shared_memory)
        # Its browser's memory comes in its heartbeats: the engine knows no pid of it to read.
        assert await until(lambda: pool.browser_pss > 0, 15.0)
        # A plausible Chromium's: PSS splits shared pages among every Chromium on the machine, so under the parallel
        # suite's load a lone browser with one page measured 19.8 MiB.
        assert handle.browser_pss == pool.browser_pss and 8 * 2**20 < pool.browser_pss < 4 * 2**30
        assert pool.peak_browser_pss >= pool.browser_pss
    finally:
        await pool.close()
        # The pool's shutdown message ends the hand-started worker too.
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""


async def test_a_hand_started_worker_whose_chromium_is_killed_leaves_nothing_in_the_hosts_temp_dir(
        site_server: str) -> None:
    # The worker's host: its system temp directory (short: Chromium's socket paths below it must fit sun_path).
    host_tmp = Path(tempfile.mkdtemp(prefix="host-", dir="/tmp"))
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0", insecure=True,
                                  start_timeout_s=60))
    starting = await started(pool)
    proc = start_worker(pool.endpoint, "remote-1", "--insecure", tmp=host_tmp)
    try:
        await starting
        await serve_one_episode(pool, site_server + "/wiki/", inline=False)
        assert len(os.listdir(host_tmp)) == 1  # one private directory, the browser's files inside it
        browsers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "chrom" in c.name().lower()]
        assert browsers
        for b in browsers:
            b.kill()
        assert proc.wait(timeout=30) != 0  # a worker whose browser died leaves (a cluster manager restarts it)
        assert os.listdir(host_tmp) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        await pool.close()
        shutil.rmtree(host_tmp, ignore_errors=True)


async def test_a_worker_cut_off_past_the_heartbeat_timeout_rejoins_when_heard_from_again(site_server: str) -> None:
    """A worker whose heartbeats stop (a link down, a paused process) is dropped and its episodes fail over; when it
    speaks again on the same connection it is taken back under a new id, not counted as a hostile peer (whose key
    would be banned), and the pages of the episodes it had are closed on it."""
    events: list[tuple[str, str]] = []
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0", insecure=True,
                                  shared_memory=False, start_timeout_s=60, heartbeat_timeout_s=2.0))
    pool.on_event = lambda kind, msg: events.append((kind, msg))
    starting = await started(pool)
    proc = start_worker(pool.endpoint, "remote-1", "--insecure")
    try:
        await starting
        [first] = pool.alive_workers()
        session = await pool.lease("cut-off")
        _, frame = await session.open(site_server + "/wiki/")
        frame.release()
        os.kill(proc.pid, signal.SIGSTOP)  # silent: no heartbeat, while its connection stays up
        for _ in range(100):
            if not first.alive:
                break
            await asyncio.sleep(0.1)
        assert not first.alive
        with pytest.raises(WorkerLost):
            await session.act(BrowserAction("scroll", direction="down"))
        await session.close()
        os.kill(proc.pid, signal.SIGCONT)
        for _ in range(150):
            if pool.alive_workers() or pool.offences:
                break
            await asyncio.sleep(0.1)
        assert not pool.offences, "the worker's messages were counted as a hostile peer's"
        [back] = pool.alive_workers()
        assert back is not first and back.wire_id == "remote-1" and back.worker_id != first.worker_id
        assert [kind for kind, _ in events if kind.startswith("worker_")] == ["worker_silent", "worker_rejoined"]
        await serve_one_episode(pool, site_server + "/wiki/", inline=True)
        for _ in range(100):  # the page of the episode that failed over, left open on the worker, is closed too
            if back.contexts == 0:
                break
            await asyncio.sleep(0.1)
        assert back.contexts == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        await pool.close()
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""


@pytest.fixture
def loopback_page() -> Iterator[str]:
    """A page on a loopback server that is not one of the engine's sites (so private by the policy's rules)."""
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<title>private page</title>ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


async def test_a_hand_started_worker_follows_the_engines_network_policy(loopback_page: str) -> None:
    """The engine's policy reaches a worker started by hand (Welcome): this engine allows private addresses,
    which the worker's own default policy refuses."""
    worker = WorkerConfig(endpoint="", net=NetSettings(allow_private_network=True))
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0", insecure=True,
                                  worker=worker, start_timeout_s=60))
    starting = await started(pool)
    proc = start_worker(pool.endpoint, "remote-1", "--insecure")
    try:
        await starting
        session = await pool.lease("e1")
        obs, frame = await session.open(loopback_page)
        frame.release()
        assert obs.title == "private page" and not obs.events
        await session.close()
    finally:
        await pool.close()
        proc.wait(timeout=30)


async def test_tcp_without_keys_needs_insecure() -> None:
    with pytest.raises(PoolError, match="PoolConfig.insecure"):
        await BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0")).start()
    res = cli("worker", "--connect", "tcp://127.0.0.1:9")
    assert res.returncode != 0 and "--insecure" in res.stderr
    res = cli("run", "--listen", "tcp://127.0.0.1:0", "--episodes", "1")
    assert res.returncode != 0 and "--insecure" in res.stderr


async def test_telemetry_on_tcp_lets_in_only_allowed_monitors(keys: Path, tmp_path: Path) -> None:
    """The telemetry socket on tcp is a CURVE server with the engine's keys: an allowed monitor gets the feed, a
    subscriber without a key gets nothing; without keys, tcp telemetry needs insecure."""
    with pytest.raises(KeyFileError, match="RunConfig.insecure"):
        TelemetryPublisher("tcp://127.0.0.1:*", tmp_path)
    server = ServerKeys.load(keys / "keys" / "engine.key_secret", keys / "allowed")
    pub = TelemetryPublisher("tcp://127.0.0.1:*", tmp_path, server_keys=server)
    pub.add_episodes([("e0#0", "e0")])
    pub.start()
    ctx = zmq.asyncio.Context()
    try:
        allowed = ctx.socket(zmq.SUB)
        ClientKeys.load(keys / "keys" / "engine.key", keys / "keys" / "w1.key_secret").apply(allowed)
        stranger = ctx.socket(zmq.SUB)
        for sub in (allowed, stranger):
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub.endpoint)
        first = msgpack.unpackb(await asyncio.wait_for(allowed.recv(), 10), raw=False)
        assert first["kind"] == "snapshot"
        assert await stranger.poll(1000) == 0  # no key: the handshake never completes, nothing arrives
    finally:
        ctx.destroy(0)
        await pub.close()


@pytest.fixture
def world_readable_key(keys: Path, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "engine.key_secret"
    shutil.copy(keys / "keys" / "engine.key_secret", path)
    path.chmod(0o644)
    yield path


async def test_a_world_readable_secret_key_is_refused(world_readable_key: Path, keys: Path) -> None:
    res = cli("run", "--listen", "tcp://127.0.0.1:0", "--server-key", str(world_readable_key),
              "--allow-keys", str(keys / "allowed"), "--episodes", "1")
    assert res.returncode != 0 and "readable by others" in res.stderr


def closed_after(host: str, port: int, limit_s: float) -> float:
    """Connect to ``host:port``, send nothing, and return how long the other side took to close the connection."""
    with socket.create_connection((host, port), timeout=limit_s) as conn:
        t0 = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            while conn.recv(4096):  # ZeroMQ's greeting, then nothing more
                pass
        return time.monotonic() - t0


@pytest.mark.wallclock
async def test_a_connection_that_never_speaks_is_closed_after_the_handshake_timeout(keys: Path,
                                                                                   tmp_path: Path) -> None:
    """Each connection a peer opens and leaves silent holds one of the engine's file descriptors until ZeroMQ
    gives up on its handshake: on the worker socket and on the telemetry socket, within HANDSHAKE_TIMEOUT_MS
    (before: ZeroMQ's default, 30 s)."""
    server = ServerKeys.load(keys / "keys" / "engine.key_secret", keys / "allowed")
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0", start_timeout_s=60,
                                  server_keys=server))
    starting = await started(pool)
    pub = TelemetryPublisher("tcp://127.0.0.1:*", tmp_path, server_keys=server)
    pub.start()
    try:
        took = await asyncio.gather(*(asyncio.to_thread(closed_after, "127.0.0.1", int(e.rsplit(":", 1)[1]), 60)
                                      for e in (pool.endpoint, pub.endpoint)))
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, PoolError):
            await starting
        await pool.close()
        await pub.close()
    limit = HANDSHAKE_TIMEOUT_MS / 1000
    assert all(limit - 1 < t < limit + 8 for t in took), took
