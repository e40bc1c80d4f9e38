"""Browser workers placed by Ray (`webgym-engine workers --ray`) on a local two-node Ray cluster join an engine over
tcp with CURVE keys, serve a run from both nodes, and come back when Ray restarts a killed actor, with no task
lost; stopped with SIGTERM, the command leaves no actor, placement group or worker process behind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from browserpool.auth import create_keypair
from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool
from browserpool.worker_host import WorkerHost
from cli.workers import workers_cmd
from engine.clients.runner import load_task_source
from engine.core.builders import pool_config
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.store.run_dir import read_records
from policy.instant import InstantPolicy

try:
    import ray
except ImportError:  # the ray extra is optional: only the test that needs a cluster is skipped
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install -e '.[ray]')")
NAMESPACE = "webgym"
PAGES = ["/wiki/", "/shop/", "/forum/", "/travel/"]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """A two-node Ray cluster on this machine (one CPU and a resource of its own per node), this process
    connected to it as a driver. Yields its address and {node id: node name}."""
    from ray.cluster_utils import Cluster

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report (and no attempt to send one)
    cluster = Cluster()
    try:
        for name in ("node_a", "node_b"):
            cluster.add_node(num_cpus=1, resources={name: 1})
        ray.init(address=cluster.address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
        nodes = {n["NodeID"]: next(k for k in n["Resources"] if k.startswith("node_"))
                 for n in ray.nodes() if n["Alive"]}
        yield cluster.address, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        # Ray's own processes (GCS, raylets, its workers) are children of this process: none may be left.
        left = _wait_until(lambda: [p for p in _children() if _is_ray(p) and p.is_running()] or None,
                           present=False, timeout=30)
        assert not left, f"Ray processes left behind: {[(p.pid, _cmdline(p)[:80]) for p in left]}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """engine.key(_secret) and ray-workers.key(_secret); allowed/ holds the workers' public key."""
    d = tmp_path_factory.mktemp("ray-curve")
    create_keypair(d, "engine")
    create_keypair(d, "ray-workers")
    (d / "allowed").mkdir()
    (d / "allowed" / "ray-workers.key").write_bytes((d / "ray-workers.key").read_bytes())
    return d


def long_tasks(tmp_path: Path, n: int, steps: int) -> Path:
    """``n`` episodes of ``steps`` harmless clicks on the bundled sites (long enough to kill a worker mid-run)."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({
        "task_id": f"long-{i}", "task_name": "click around", "website": "{SITES}" + PAGES[i % len(PAGES)],
        "difficulty": 1, "max_steps": steps,
        "evaluator_reference": [{"id": 1, "description": "d", "facts": ["still on the site"],
                                 "checks": [{"kind": "url", "contains": "127.0.0.1"}]}]}) + "\n"
        for i in range(n)))
    return path


def test_the_command_refuses_what_cannot_work_before_it_touches_ray(keys: Path) -> None:
    def refusal(*args: str) -> str:
        res = CliRunner().invoke(workers_cmd, list(args))
        assert res.exit_code != 0, res.output
        return res.output

    assert "--ray" in refusal("--connect", "tcp://engine:5555", "--insecure")
    assert "must be tcp://" in refusal("--ray", "--connect", "ipc:///tmp/engine.sock", "--insecure")
    assert "needs CURVE keys" in refusal("--ray", "--connect", "tcp://engine:5555")
    assert "both --server-key" in refusal("--ray", "--connect", "tcp://engine:5555",
                                          "--server-key", str(keys / "engine.key"))
    (keys / "open.key_secret").write_bytes((keys / "ray-workers.key_secret").read_bytes())
    (keys / "open.key_secret").chmod(0o644)
    assert "readable by others" in refusal("--ray", "--connect", "tcp://engine:5555", "--server-key",
                                           str(keys / "engine.key"), "--key", str(keys / "open.key_secret"))


def test_a_hosted_worker_that_fails_ends_its_host(tmp_path: Path) -> None:
    """A worker that cannot start (no Chromium) ends its host, so that the cluster manager restarts the host."""
    failed: list[int] = []
    done = threading.Event()

    class Host(WorkerHost):
        def fail(self, code: int) -> None:  # the real one exits this process
            failed.append(code)
            done.set()

    cfg = WorkerConfig(endpoint="tcp://127.0.0.1:9", insecure=True, chromium_path=str(tmp_path / "no-chromium"))
    host = Host(cfg, "t")
    try:
        info = host.info()
        assert info["worker_id"] == f"t-{os.getpid()}-0" and info["generation"] == 0 and info["host_pid"] == os.getpid()
        assert done.wait(60) and failed[0] != 0
    finally:
        shutil.rmtree(host.tmp_dir, ignore_errors=True)


@needs_ray
@pytest.mark.asyncio(loop_scope="session")
async def test_ray_placed_workers_serve_a_run_and_come_back(ray_cluster: tuple[str, dict[str, str]], keys: Path,
                                                            site_server: str, tmp_path: Path) -> None:
    address, nodes = ray_cluster
    cfg = RunConfig(tasks=str(long_tasks(tmp_path, 4, 12)), output_dir=str(tmp_path / "runs"), concurrency=4,
                    workers=2, listen="tcp://127.0.0.1:0", spawn_workers=False, telemetry=None, retry_lost=1,
                    server_key=str(keys / "engine.key_secret"), allow_keys=str(keys / "allowed"))
    # A worker whose actor was killed stops heartbeating: noticed after 3 s instead of the default 15.
    pool = BrowserPool(replace(pool_config(cfg, None), heartbeat_timeout_s=3.0, start_timeout_s=150))
    starting = asyncio.ensure_future(pool.start())
    while not pool.endpoint and not starting.done():
        await asyncio.sleep(0.01)
    log = tmp_path / "workers.log"
    cmd = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "workers", "--ray", "--address", address, "--connect", pool.endpoint,
         "--per-node", "1", "--cpus-per-worker", "1", "--memory-per-worker", "256", "--max-restarts", "2",
         "--server-key", str(keys / "engine.key"), "--key", str(keys / "ray-workers.key_secret")],
        stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    core: EngineCore | None = None
    pools = [pool]
    try:
        await starting  # both workers joined (spawn off: the pool waits for cfg.workers to connect)
        first = {h.worker_id for h in pool.alive_workers()}
        # One worker on each node: ray-<node id[:8]>-<bundle>.<slot>-<actor pid>-<n>.
        assert {wid.split("-")[1] for wid in first} == {n[:8] for n in nodes}, (first, nodes)
        assert all(h.public_key is not None for h in pool.alive_workers())  # joined with the CURVE key

        core = EngineCore(cfg, base_url=site_server, pool=pool)
        await core.start()
        tasks = load_task_source(cfg.tasks, site_server)
        running = asyncio.ensure_future(core.run_plan(InstantPolicy(1275, 384), [(t, 0) for t in tasks]))
        while core.stats.steps < 6 and not running.done():
            await asyncio.sleep(0.05)
        busy = [h for h in pool.alive_workers() if h.episodes]
        assert busy and not running.done(), "the run ended before the kill"
        victim = busy[0].worker_id
        slot = victim.split("-")[2]
        await asyncio.to_thread(_kill_actor, slot)

        stats = await asyncio.wait_for(running, 180)
        # The restarted actor's worker joins under a new id; the engine saw the old one leave.
        replacement = await _poll(lambda: next((h.worker_id for h in pool.alive_workers()
                                                if h.worker_id.split("-")[2] == slot and h.worker_id not in first),
                                               None), 120)
        assert replacement and replacement != victim
        assert not pool.workers[victim].alive

        records = read_records(core.run_dir)
        assert sorted(r["task"]["task_id"] for r in records) == [f"long-{i}" for i in range(4)]  # each exactly once
        assert stats.summary()["lost"] == 0 and {r["status"] for r in records} == {"success"}
        retried = [r for r in records if r["attempts"] == 2]
        assert retried and all(r["previous_errors"][0]["kind"] == "worker_lost" for r in retried)
        # The command reported the death and the restart.
        restarted = f"actor {slot} restarted: worker {replacement} replaces {victim}"
        assert await _poll(lambda: restarted in log.read_text() or None, 30), log.read_text()[-3000:]
        assert f"actor {slot} died (worker {victim})" in log.read_text()

        # The engine closes (it shuts its workers down): each actor starts a worker for the next engine on the same
        # endpoint, and they join it.
        await core.close()
        core = None
        await pool.close()
        assert await _poll(lambda: log.read_text().count("was shut down by its engine") == 2 or None, 60), \
            log.read_text()[-3000:]
        pool = BrowserPool(replace(pool.cfg, listen=pool.endpoint))
        pools.append(pool)
        await pool.start()
        assert {h.worker_id.rsplit("-", 1)[1] for h in pool.alive_workers()} == {"1"}  # their second workers

        # SIGTERM: the command removes its actors and placement group and exits 0; the workers die with their
        # actors, and the engine sees them leave.
        cmd.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(cmd.wait, 90) == 0, log.read_text()[-3000:]
        assert await _poll(lambda: not pool.alive_workers() or None, 30), [h.worker_id for h in pool.alive_workers()]
        named, groups = await asyncio.to_thread(_ray_leftovers)
        assert not named and not groups, (named, groups)
        left = _wait_until(lambda: _worker_processes(pool.endpoint) or None, present=False, timeout=30)
        assert not left, f"worker processes left behind: {left}"
    finally:
        if cmd.poll() is None:
            cmd.kill()
            cmd.wait(30)
        if core is not None:
            await core.close()
        for p in pools:
            await p.close()
    text = log.read_text()
    assert "started" in text and "removed 2 actors" in text, text[-3000:]


def _kill_actor(slot: str) -> None:
    """Kill the actor of ``slot`` as a failure would (Ray restarts it)."""
    [name] = [n for n in ray.util.list_named_actors() if n.startswith("webgym-workers-") and n.endswith(f"-{slot}")]
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)


def _ray_leftovers() -> tuple[list[str], list[str]]:
    """Named worker actors still known to Ray, and worker placement groups not removed."""
    named = [n for n in ray.util.list_named_actors() if n.startswith("webgym-workers-")]
    groups = [g["name"] for g in ray.util.placement_group_table().values()
              if g["name"].startswith("webgym-workers-") and g["state"] != "REMOVED"]
    return named, groups


async def _poll(probe: Callable[[], Any], timeout: float) -> Any:
    """The first truthy value of ``probe()``, polled until ``timeout`` (then None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        await asyncio.sleep(0.1)
    return None


def _wait_until(probe: Callable[[], Any], present: bool, timeout: float) -> Any:
    """Poll ``probe()`` until its truthiness is ``present`` or ``timeout``; returns its last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while bool(value) != present and time.monotonic() < deadline:
        time.sleep(0.2)
        value = probe()
    return value


def _children() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _is_ray(p: psutil.Process) -> bool:
    line = _cmdline(p)
    return "site-packages/ray/" in line or line.startswith("ray::")


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _worker_processes(endpoint: str) -> list[int]:
    """Browser worker processes (anywhere on this machine) that were told to connect to ``endpoint``."""
    found = []
    for p in psutil.process_iter():
        line = _cmdline(p)
        if "browserpool.worker" in line and endpoint in line:
            found.append(p.pid)
    return found
