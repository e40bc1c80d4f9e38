"""A worker started by hand (`webgym-engine worker --connect`) joins an engine over tcp."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from browserpool.pool import BrowserPool, PoolConfig
from browserpool.protocol import BrowserAction
from engine._imgcodec import jpeg_size

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.parametrize("shared_memory", [True, False])
async def test_hand_started_worker_over_tcp(site_server: str, shared_memory: bool) -> None:
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen="tcp://127.0.0.1:0",
                                  shared_memory=shared_memory, start_timeout_s=60))
    starting = asyncio.ensure_future(pool.start())
    while not pool.endpoint:
        await asyncio.sleep(0.01)
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", "--connect", pool.endpoint,
                             "--worker-id", "remote-1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await starting
        [handle] = pool.alive_workers()
        assert handle.worker_id == "remote-1" and (handle.reader is not None) == shared_memory
        session = await pool.lease("e1")
        obs, frame = await session.open(site_server + "/wiki/")
        with frame:
            assert jpeg_size(frame.view) == (1280, 768)
        assert (obs.frame is not None) == shared_memory and (obs.frame_bytes is not None) != shared_memory
        obs, frame = await session.act(BrowserAction("scroll", direction="down"))
        frame.release()
        assert obs.settled and obs.url.endswith("/wiki/")
        await session.close()
    finally:
        await pool.close()
        # The pool's shutdown message ends the hand-started worker too.
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
