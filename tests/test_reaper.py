"""Leftovers of dead engines (browserpool/reaper.py), the environment spawned workers get
(browserpool/childenv.py), and a worker's tie to its engine (browserpool/lifeline.py), on real processes,
real /dev/shm segments and real directories."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import pytest

from browserpool.childenv import is_secret, worker_env
from browserpool.instance import Instance, process_start_ticks
from browserpool.lifeline import EngineWatch, parse_engine
from browserpool.reaper import SHM_DIR, reap_stale

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def other_process() -> Iterator[tuple[subprocess.Popen[bytes], Instance]]:
    """A live process that is not this one (an "engine" for the reaper), killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    start = process_start_ticks(proc.pid)
    assert start is not None
    try:
        yield proc, Instance(proc.pid, start)
    finally:
        proc.kill()
        proc.wait()


def make_segment(name: str) -> str:
    """A real shared-memory segment (this process's resource tracker is told to leave it alone)."""
    seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    seg.close()
    return name


def shm_exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name))


def test_reaper_removes_a_dead_engines_leftovers_and_keeps_a_live_ones(tmp_path: Path) -> None:
    with other_process() as (proc, live):
        dead = Instance(live.pid, live.start + 1)  # same pid, another start time: a process that is gone
        names = {
            "live": make_segment(live.new_shm_name("w0")),
            "dead": make_segment(dead.new_shm_name("w0")),
            "mine": make_segment(Instance.current().new_shm_name("w1")),
            "foreign": make_segment(f"wg-{live.pid}-abcdef12"),  # not the naming scheme: never touched
        }
        dirs = {"live": live.tmp_prefix() + "x1", "dead": dead.tmp_prefix() + "x2", "foreign": "webgym-telemetry-x"}
        for d in dirs.values():
            (tmp_path / d / "w0").mkdir(parents=True)
            (tmp_path / d / "w0" / "profile").write_text("x")
        (tmp_path / (dead.tmp_prefix() + "file")).write_text("a file, not a directory")
        try:
            reaped = reap_stale(tmp_dir=str(tmp_path))
            # /dev/shm is the machine's: another dead engine's leftovers may be reaped too, so only ours are named.
            ours = set(names.values())
            assert ours & set(reaped.segments) == {names["dead"]} and reaped.tmp_dirs == [dirs["dead"]]
            assert not shm_exists(names["dead"]) and not (tmp_path / dirs["dead"]).exists()
            for key in ("live", "mine", "foreign"):
                assert shm_exists(names[key]), key
            assert (tmp_path / dirs["live"]).exists() and (tmp_path / dirs["foreign"]).exists()
            assert (tmp_path / (dead.tmp_prefix() + "file")).exists()

            proc.kill()  # the live engine dies (and is reaped by its parent): its leftovers are stale now
            proc.wait()
            reaped = reap_stale(tmp_dir=str(tmp_path))
            assert ours & set(reaped.segments) == {names["live"]} and reaped.tmp_dirs == [dirs["live"]]
            assert shm_exists(names["mine"]) and shm_exists(names["foreign"])
        finally:
            for name in names.values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(SHM_DIR, name))


def test_a_zombie_does_not_count_as_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_ticks(proc.pid)
    assert start is not None
    inst = Instance(proc.pid, start)
    deadline = time.monotonic() + 30
    while inst.alive() and time.monotonic() < deadline:  # exited, not yet waited for: a zombie
        time.sleep(0.01)
    try:
        assert not inst.alive() and process_start_ticks(proc.pid) == start
    finally:
        proc.wait()


def test_worker_env_drops_secrets_and_keeps_the_rest() -> None:
    base = {
        "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "DISPLAY": ":0", "XDG_RUNTIME_DIR": "/run/user/0",
        "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/lib", "HTTP_PROXY": "http://proxy:3128", "TMPDIR": "/tmp",
        "OPENAI_API_KEY": "sk-1", "JUDGE_API_KEY": "sk-2", "HF_TOKEN": "hf-3", "GITHUB_TOKEN": "gh-4",
        "AWS_SECRET_ACCESS_KEY": "a", "AWS_PROFILE": "p", "DB_PASSWORD": "pw", "MY_SECRET_THING": "s",
        "DATABASE_URL": "postgres://user:hunter2@db/x", "HTTPS_PROXY": "http://u:p@proxy:3128",
        "WANDB_API_KEY": "w", "VLLM_KEY": "k", "SSH_AUTH_SOCK": "/tmp/agent",
    }
    env = worker_env(base, drop=["LANG"])
    assert set(env) == {"PATH", "HOME", "DISPLAY", "XDG_RUNTIME_DIR", "PYTHONPATH", "LD_LIBRARY_PATH", "HTTP_PROXY",
                        "TMPDIR"}
    assert is_secret("anthropic_api_key", "x") and not is_secret("PATH", "http://u:p@x/")


def test_parse_engine() -> None:
    assert parse_engine("12:345") == Instance(12, 345)
    with pytest.raises(ValueError, match="PID:START"):
        parse_engine("12")


def test_engine_watch_fires_when_the_engine_dies_and_not_before() -> None:
    with other_process() as (proc, engine):
        fired = threading.Event()
        EngineWatch(engine, fired.set).start()
        assert not fired.wait(0.5)
        proc.kill()
        proc.wait()
        assert fired.wait(5)
    # An engine that is already gone: at once.
    gone = threading.Event()
    EngineWatch(Instance(engine.pid, engine.start + 1), gone.set).start()
    assert gone.wait(5)


def test_kill_descendants_reaches_detached_process_groups() -> None:
    # A child that starts a grandchild in its own process group and session (as Playwright starts Chromium),
    # run in a separate process so that kill_descendants only sees these two.
    code = (
        "import os, subprocess, sys, time\n"
        "from browserpool.lifeline import kill_descendants\n"
        "c = subprocess.Popen([sys.executable, '-c', "
        "'import subprocess,sys,time; subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(300)\"], "
        "start_new_session=True); time.sleep(300)'])\n"
        "deadline = time.time() + 30\n"
        "import psutil\n"
        "while len(psutil.Process().children(recursive=True)) < 2 and time.time() < deadline: time.sleep(0.05)\n"
        "kids = psutil.Process().children(recursive=True)\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "print(kill_descendants(), flush=True)\n"
        "c.wait()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    pids_line, count_line = out.stdout.splitlines()[:2]
    pids = [int(p) for p in pids_line.split()]
    assert len(pids) == 2 and int(count_line) == 2
    deadline = time.monotonic() + 5
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(p) for p in pids)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False
