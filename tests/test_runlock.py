"""The run-directory writer lock (engine/store/runlock.py) and what --resume does to a run directory: one writer per
run directory across processes, re-entrant within one, gone with its holder (kill -9 included); readers never
blocked; frames of attempts without a record removed; judge_pending records judged again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from browserpool.pool import BrowserPool
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.rewards.judge import JudgeConfig, RubricJudge
from engine.store.run_dir import RunStore, read_records
from engine.store.runlock import LOCK_NAME, RunDirBusy, holder_pid, lock_run_dir
from policy.registry import make_judge, make_policy
from tests.chat_test_server import ChatTestServer
from tests.conftest import subset
from tests.test_rewards_flow import PassingJudgeTestModel

ROOT = Path(__file__).resolve().parents[1]

# A separate process that takes the lock, says so, and holds it until killed.
HOLDER = textwrap.dedent("""
    import sys, time
    from engine.store.runlock import lock_run_dir
    lock_run_dir(sys.argv[1])
    print("HOLDING", flush=True)
    time.sleep(300)
""")

# A separate process that tries to take the lock once: exit 0 when it got it, 3 when refused.
TRY = textwrap.dedent("""
    import sys
    from engine.store.runlock import RunDirBusy, lock_run_dir
    try:
        lock_run_dir(sys.argv[1])
    except RunDirBusy as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
""")


def _python(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True, **kw)  # type: ignore[call-overload]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding tmp_path's writer lock (killed at the end)."""
    proc = _python(HOLDER, str(tmp_path), stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "HOLDING"
    yield proc
    proc.kill()
    proc.wait()


def _try_in_child(run_dir: Path) -> tuple[int, str]:
    proc = _python(TRY, str(run_dir), stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_second_writer_is_refused_with_the_holders_pid(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(RunDirBusy) as info:
        lock_run_dir(tmp_path)
    assert info.value.pid == holder.pid and f"{tmp_path} is in use by pid {holder.pid}" in str(info.value)
    with pytest.raises(RunDirBusy):
        RunStore(tmp_path)  # every writer of a run directory goes through the lock
    assert not (tmp_path / "episodes.jsonl").exists()  # refused before it touched anything


def test_readers_are_not_blocked(tmp_path: Path) -> None:
    with RunStoreClosing(tmp_path) as store:
        store.append({"episode_id": "t#0", "task": {"task_id": "t"}, "status": "success"})
        # Another process reads the run while the writer holds it.
        proc = _python("import sys; from engine.store.run_dir import read_records; "
                       "print(len(read_records(sys.argv[1])))",
                       str(tmp_path), stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip() == "1"


def test_kill_9_of_the_holder_leaves_no_stale_lock(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    assert _try_in_child(tmp_path)[0] == 3
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # The lock file stays behind, naming its dead holder, but holds nothing: the kernel dropped the lock.
    assert (tmp_path / LOCK_NAME).exists() and holder_pid(tmp_path) == holder.pid
    with lock_run_dir(tmp_path):
        assert holder_pid(tmp_path) == os.getpid()


def test_the_lock_is_reentrant_in_one_process_and_released_with_the_last_hold(tmp_path: Path) -> None:
    first = RunStore(tmp_path)
    second = RunStore(tmp_path)  # e.g. the CLI's early hold, then the run's store
    assert _try_in_child(tmp_path)[0] == 3
    first.close()
    code, err = _try_in_child(tmp_path)
    assert code == 3 and f"in use by pid {os.getpid()}" in err  # still held by the second
    second.close()
    assert _try_in_child(tmp_path) == (0, "")


def test_the_judge_command_refuses_a_live_run(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    (tmp_path / "episodes.jsonl").write_text("")
    proc = subprocess.run([sys.executable, "-m", "cli.main", "judge", str(tmp_path), "--judge-base-url",
                           "http://127.0.0.1:9/v1", "--judge-model", "m"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert f"is in use by pid {holder.pid}" in proc.stderr


def test_resume_removes_frames_of_attempts_without_a_record(tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    for name in ("done_0", "killed_0", "a_b_0"):
        (frames / name).mkdir(parents=True)
        (frames / name / "000.jpg").write_bytes(b"\xff\xd8")
    (frames / "stray.txt").write_text("not an episode directory")
    with RunStoreClosing(tmp_path) as store:
        store.append({"episode_id": "done#0", "task": {"task_id": "done"}, "status": "success"})
        # Written before an episode of an id with other characters got a hashed directory: its record's screenshots
        # say where they are, and that directory is kept.
        store.append({"episode_id": "a/b#0", "task": {"task_id": "a/b"}, "status": "failure",
                      "steps": [{"step": 0, "action": {"name": "wait"}, "screenshot": "frames/a_b_0/000.jpg"}]})
        removed = store.remove_unrecorded_frames(read_records(tmp_path))
    assert removed == ["killed_0"]
    assert sorted(p.name for p in frames.iterdir()) == ["a_b_0", "done_0", "stray.txt"]


class RunStoreClosing:
    """``with RunStoreClosing(dir) as store``: a RunStore closed (and its lock released) at the end."""

    def __init__(self, run_dir: Path) -> None:
        self.store = RunStore(run_dir)

    def __enter__(self) -> RunStore:
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()


# --- --resume judges what is still pending -------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def judge_server() -> AsyncIterator[ChatTestServer]:
    async with ChatTestServer(PassingJudgeTestModel(), served_model_name="judge") as server:
        yield server


@pytest.mark.asyncio(loop_scope="session")
async def test_resume_rejudges_pending_records(
        tmp_path: Path, sites: str, judge_server: ChatTestServer, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())

    def cfg(run_dir: str | None = None) -> RunConfig:
        return RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), run_dir=run_dir, concurrency=4,
                         workers=1, reward="judge", telemetry=None)

    def judge() -> RubricJudge:
        return make_judge(JudgeConfig(base_url=judge_server.base_url, model="judge", backoff_s=0.01, retries=1))

    judge_server.fail_next(10_000, 500, message="judge down")
    try:
        _, run_dir = await run(cfg(), make_policy("scripted"), sites, judge=judge(), pool=pool)
    finally:
        judge_server.clear_faults()
    assert [r["status"] for r in read_records(run_dir)] == ["judge_pending"] * n
    calls = len(judge_server.received)

    # What --resume does:
    stats, _ = await run(cfg(str(run_dir)), make_policy("scripted"), sites, judge=judge(), pool=pool)
    assert stats.total == 0  # every task has its record: nothing reran ...
    raw = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(raw) == n  # ... and no record was written twice
    assert [r["status"] for r in read_records(run_dir)] == ["success"] * n  # ... but the judge came back
    assert len(judge_server.received) > calls
