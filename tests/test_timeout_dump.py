"""A test past its timeout in an xdist worker: the run's log says where it hung, and the run ends as a failure
instead of hanging (``make test``'s ``--max-worker-restart 0``; a restarted worker hung xdist's ``loadfile``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HANGING = '''
import asyncio
import pytest

@pytest.mark.timeout(2)
async def test_hang():
    async def stuck_in_here():
        await asyncio.sleep(100)
    await asyncio.gather(stuck_in_here())

def test_after():
    pass
'''


def test_a_hung_test_in_a_worker_reports_its_stacks_and_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_hanging.py").write_text(HANGING)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tests.timeout_dump",)\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout_method = thread\nasyncio_mode = auto\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
                          "--max-worker-restart", "0", "test_hanging.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    log = out.stdout + out.stderr
    assert out.returncode == 1, log
    assert "Timeout: test_hanging.py::test_hang still ran after 2 s" in log
    # Where it hung: the task's own frame, not only the event loop's.
    assert "in stuck_in_here" in log and "await asyncio.sleep(100)" in log
    assert "worker 'gw0' crashed while running 'test_hanging.py::test_hang'" in log
