"""``webgym-engine openenv`` against OpenEnv's own client (the ``openenv`` package, pinned in
tests/frameworks/openenv.txt, run in ``.venv-openenv``): concurrent sessions in both vocabularies solve bundled tasks,
every episode is recorded once, a session past the capacity and an invalid action get OpenEnv's errors.

``make test`` builds ``.venv-openenv`` and runs this file with the project's interpreter (docs/openenv.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine.store.run_dir import read_records
from train.policy_target import free_port

ROOT = Path(__file__).resolve().parents[2]
OPENENV_PYTHON = ROOT / ".venv-openenv" / "bin" / "python"
SESSIONS = 16


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def test_openenvs_own_client_runs_concurrent_sessions_on_the_engine(tmp_path: Path) -> None:
    assert OPENENV_PYTHON.exists(), "`make .venv-openenv/.installed` builds it (make test does)"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "OPENENV_API_KEY"}
    server = subprocess.Popen([sys.executable, "-m", "cli.main", "openenv", "--port", str(port), "--workers", "2",
                               "--capacity", str(SESSIONS), "--telemetry", "off", "--output", str(tmp_path)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read() if server.stdout else ""
            time.sleep(0.2)
        client = subprocess.run([str(OPENENV_PYTHON), str(ROOT / "tests/frameworks/openenv_client.py"), url,
                                 str(SESSIONS)], capture_output=True, text=True, timeout=600)
        assert client.returncode == 0, client.stdout[-3000:] + client.stderr[-3000:]
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=60)
    assert server.returncode == 0, out[-3000:]
    report = json.loads(client.stdout.strip().splitlines()[-1])
    results = report["results"]
    print(f"{SESSIONS} OpenEnv sessions, 3 calls each: {report['wall_s']:.1f} s")
    assert len(results) == SESSIONS
    for r in results:
        assert r["rewards"] == [0.0, 0.0, 1.0] and r["done"] == [False, False, True] and r["steps"] == 2, r
    assert results[0]["shape"][2] == 3 and results[0]["shape"][0] < results[0]["shape"][1]  # (height, width, RGB)
    assert all(r["jpeg"] for r in results[1:])
    assert "CAPACITY_REACHED" in report["full"] and "VALIDATION_ERROR" in report["invalid"]
    assert report["after_invalid_done"] is False  # the session went on after the refused action
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    records = read_records(run_dir)
    solved = [r for r in records if r["status"] == "success"]
    assert sorted(r["episode_id"] for r in solved) == sorted(r["episode_id"] for r in results)
    # Besides them, only the last session's episode, ended by its client's close (no episode runs twice).
    assert len(records) == SESSIONS + 1 and len({r["episode_id"] for r in records}) == len(records)
