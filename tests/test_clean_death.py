"""Clean deaths, end to end: a real `webgym-engine run` (its own process, a browser worker, the Playwright driver,
Chromium, the site server) is killed mid-run with SIGKILL, SIGTERM or a SIGHUP to its whole process group.

After each, within a few seconds, no process of that run is left (found by a marker in their environment, which
every descendant inherits, and by the process tree recorded before the kill), no shared-memory segment or temp
directory carries the engine's name; `run --resume` then gives exactly one record per task. While the run is live
a second writer is refused. Spawned workers and Chromium never see the engine's API keys.

Then what must not kill a run, or must stop it cleanly: a full disk (a clean stop, then `--resume`), a console that
cannot be written, a flood of silent connections to its worker socket."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import pty
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from browserpool.config import DEFAULT_CHROMIUM
from engine.store.run_dir import read_records
from engine.tasks.schema import BUNDLED_TASKS
from tests.conftest import SmallDisk

ROOT = Path(__file__).resolve().parents[1]
MARK = "WEBGYM_CLEAN_DEATH_TEST"
SECRET = "sk-clean-death-" + uuid.uuid4().hex  # an API key the engine holds
N_TASKS = 8
GONE_WITHIN_S = 5.0


@dataclass
class Engine:
    """A `webgym-engine run` subprocess (its own session and process group) and what identifies its processes."""

    proc: subprocess.Popen[bytes]
    marker: str
    output: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def run_dir(self) -> Path | None:
        dirs = list(self.output.glob("run-*")) if self.output.exists() else []
        return dirs[0] if dirs else None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def write_tasks(path: Path, n: int) -> Path:
    """The first ``n`` bundled tasks, as a task file at ``path``."""
    path.write_text("\n".join(BUNDLED_TASKS.read_text().splitlines()[:n]) + "\n")
    return path


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    return write_tasks(tmp_path / "tasks.jsonl", N_TASKS)


def engine_cmd(tasks: Path, output: Path, *extra: str) -> list[str]:
    # The random policy takes up to 10 steps per episode: episodes stay in flight long enough to be cut.
    return [sys.executable, "-m", "cli.main", "run", "--tasks", str(tasks), "--policy", "random",
            "--concurrency", "4", "--workers", "1", "--telemetry", "off", "--output", str(output), *extra]


@pytest.fixture
def start_engine(tmp_path: Path, tasks: Path) -> Iterator[Callable[..., Engine]]:
    started: list[Engine] = []

    def start(*extra: str, ignore: signal.Signals | None = None, terminal: int | None = None,
              cmd: list[str] | None = None) -> Engine:
        marker = uuid.uuid4().hex
        env = {**os.environ, MARK: marker, "OPENAI_API_KEY": SECRET, "HF_TOKEN": SECRET}
        log = tmp_path / f"engine-{len(started)}.log"
        # ignore: the engine starts with that signal ignored, as under nohup (SIGHUP) or as a script's background
        # job (SIGINT). Otherwise both are reset to their defaults: a test suite itself started under nohup or in
        # the background would pass its ignored signals on, and the engine keeps ignoring what it inherits.
        # terminal: a pseudo-terminal's follower end, which becomes the engine's standard streams and its
        # session's controlling terminal (as in a terminal window or a tmux pane).
        def pre() -> None:
            for sig in (signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN if sig == ignore else signal.SIG_DFL)
            if terminal is not None:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        with open(log, "wb") as err:
            streams = {"stdin": subprocess.DEVNULL, "stdout": err, "stderr": err} if terminal is None else {
                "stdin": terminal, "stdout": terminal, "stderr": terminal}
            proc = subprocess.Popen(cmd or engine_cmd(tasks, tmp_path / "runs", *extra), cwd=ROOT, env=env,
                                    start_new_session=True, preexec_fn=pre, **streams)  # type: ignore[call-overload]
        started.append(Engine(proc, marker, tmp_path / "runs", log))
        return started[-1]

    yield start
    for e in started:  # a failed test must not leave its run behind either
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()
        for pid in marked_processes(e.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def marked_processes(marker: str, sessions: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """Live (non-zombie) processes of the run: their environment carries its marker, or they belong to one of its
    ``sessions`` (Chromium's zygotes and renderers overwrite their environment with their command line, but stay
    in the session Playwright started Chromium in)."""
    needle = f"{MARK}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state, _ppid, _pgrp, session = f.read().rsplit(b")", 1)[1].split()[:4]
            if state in (b"Z", b"X"):
                continue
            if int(session) not in sessions:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle not in f.read():
                        continue
        except (OSError, ValueError):
            continue
        found.append(int(entry.name))
    return found


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until ``predicate()``; returns the seconds it took (fails the test past ``timeout``)."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def wait_in_flight(engine: Engine) -> Path:
    """Wait until episodes are in flight: frames of more episodes than there are records."""
    def in_flight() -> bool:
        assert engine.proc.poll() is None, engine.stderr()
        run_dir = engine.run_dir()
        if run_dir is None or not (run_dir / "frames").exists():
            return False
        started = sum(1 for p in (run_dir / "frames").iterdir() if any(p.iterdir()))
        return started >= 3 and started > len(read_records(run_dir))
    wait_for(in_flight, 120, "episodes in flight")
    run_dir = engine.run_dir()
    assert run_dir is not None
    return run_dir


def process_tree(engine: Engine) -> list[psutil.Process]:
    """The engine's descendants now: the worker, its Playwright driver and Chromium, the site server..."""
    tree = [p for p in psutil.Process(engine.pid).children(recursive=True) if _runs(p)]
    names = " ".join(" ".join(cmdline(p)[:3]) for p in tree)
    assert "browserpool.worker" in names and "chromium" in names and "playwright" in names, names
    return tree


def run_sessions(engine: Engine, tree: list[psutil.Process]) -> set[int]:
    """The sessions of the run's processes (the engine's own, Chromium's), never this test's."""
    sessions = {engine.pid}  # started with start_new_session
    for p in tree:
        with contextlib.suppress(OSError):
            sessions.add(os.getsid(p.pid))
    sessions.discard(os.getsid(0))
    assert len(sessions) >= 2, "Chromium runs in a session of its own"
    return sessions


def assert_nothing_left(engine: Engine, tree: list[psutil.Process]) -> float:
    """No process of the run, no segment or temp directory named after the engine; returns how long it took."""
    sessions = run_sessions(engine, tree)
    took = wait_for(lambda: not marked_processes(engine.marker, sessions) and not any(_runs(p) for p in tree),
                    GONE_WITHIN_S, "every process of the run to end")
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"wg-{engine.pid}-")]
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"webgym-{engine.pid}-")]
    return took


def cmdline(p: psutil.Process) -> list[str]:
    """A process's command line; empty once it is gone (a renderer may end any time)."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _runs(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def resume_and_check(run_dir: Path, tasks: Path, tmp_path: Path) -> list[dict]:
    """`run --resume` to the end; every task has exactly one record and every frame directory belongs to one."""
    # A frame of the killed attempt of an episode that never got its record: the rerun must not keep it.
    unrecorded = {p.name for p in (run_dir / "frames").iterdir()} - {
        r["episode_id"].replace("#", "_") for r in read_records(run_dir)}
    assert unrecorded, "no episode was in flight when the run was stopped"
    planted = run_dir / "frames" / sorted(unrecorded)[0] / "999.jpg"
    planted.write_bytes(b"\xff\xd8 a frame of a dead attempt")
    proc = subprocess.run(engine_cmd(tasks, tmp_path / "runs", "--resume", str(run_dir)), cwd=ROOT,
                          capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    records = read_records(run_dir)
    raw = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    counts = collections.Counter(r["task"]["task_id"] for r in raw)
    want = {json.loads(line)["task_id"] for line in tasks.read_text().splitlines()}
    assert set(counts) == want and set(counts.values()) == {1}, counts
    assert not planted.exists()
    for r in records:  # every stored screenshot of a finished episode is one its record refers to
        if r["status"] in ("success", "failure"):
            refs = {s["screenshot"] for s in r["steps"] if s.get("screenshot")} | {r["final"]["screenshot"]}
            on_disk = {f"frames/{p.parent.name}/{p.name}"
                       for p in (run_dir / "frames" / r["episode_id"].replace("#", "_")).iterdir()}
            assert on_disk == refs, r["episode_id"]
    return records


def no_lost_episodes(run_dir: Path) -> None:
    """Nothing was recorded as the casualty of the stop: no episode lost its worker or browser."""
    for r in read_records(run_dir):
        kind = (r.get("error") or {}).get("kind", "")
        assert kind != "worker_lost" and not kind.startswith("browser"), r["error"]


def test_kill_9_leaves_no_process_segment_or_temp_dir_and_resume_completes(
        start_engine: Callable[..., Engine], tasks: Path, tmp_path: Path) -> None:
    engine = start_engine()
    run_dir = wait_in_flight(engine)
    tree = process_tree(engine)
    # The engine's API keys reach neither the worker nor Chromium (their environment is otherwise the engine's).
    # (Chromium's zygotes and renderers overwrite theirs with their command line: its browser process, the one the
    # Playwright driver started, is the one to read.)
    [worker] = [p for p in tree if "browserpool.worker" in cmdline(p)]
    [browser] = [p for p in tree if cmdline(p)[:1] == [DEFAULT_CHROMIUM] and "playwright/driver" in
                 " ".join(cmdline(p.parent()))]
    for p in (worker, browser):
        env = Path(f"/proc/{p.pid}/environ").read_bytes()
        assert engine.marker.encode() in env and SECRET.encode() not in env, cmdline(p)[:2]
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"wg-{engine.pid}-")]  # the ring, while it runs

    engine.proc.send_signal(signal.SIGKILL)
    assert engine.proc.wait(10) == -signal.SIGKILL
    took = assert_nothing_left(engine, tree)
    print(f"kill -9: every process of the run gone {took:.2f} s after the engine died")
    resume_and_check(run_dir, tasks, tmp_path)


def test_sigterm_is_handled_like_ctrl_c_and_a_second_writer_is_refused(
        start_engine: Callable[..., Engine], tasks: Path, tmp_path: Path) -> None:
    # Twice the tasks of the other tests: the run must outlast a second engine's start-up, which on a loaded
    # machine took longer than the rest of a run of 8.
    write_tasks(tasks, 2 * N_TASKS)
    engine = start_engine()
    run_dir = wait_in_flight(engine)
    tree = process_tree(engine)

    second = subprocess.run(engine_cmd(tasks, tmp_path / "runs", "--resume", str(run_dir)), cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode != 0 and f"{run_dir} is in use by pid {engine.pid}" in second.stderr, second.stderr
    assert engine.proc.poll() is None, "the run must still be going for the stop below to count"

    t0 = time.monotonic()
    engine.proc.send_signal(signal.SIGTERM)
    assert engine.proc.wait(30) == 128 + signal.SIGTERM, engine.stderr()
    stopped = time.monotonic() - t0
    assert "stopped by SIGTERM" in engine.stderr() and "--resume" in engine.stderr()
    took = assert_nothing_left(engine, tree)
    print(f"SIGTERM: the engine exited after {stopped:.2f} s, the rest was gone {took:.2f} s later")
    no_lost_episodes(run_dir)
    resume_and_check(run_dir, tasks, tmp_path)


def test_sighup_to_the_whole_process_group(start_engine: Callable[..., Engine]) -> None:
    # What a closed terminal (or `timeout`, with SIGTERM) does: every process of the group gets the signal at once;
    # the worker waits for its engine's shutdown instead of dying under the episodes it serves.
    engine = start_engine()
    run_dir = wait_in_flight(engine)
    tree = process_tree(engine)
    t0 = time.monotonic()
    os.killpg(engine.pid, signal.SIGHUP)
    assert engine.proc.wait(30) == 128 + signal.SIGHUP, engine.stderr()
    stopped = time.monotonic() - t0
    assert "stopped by SIGHUP" in engine.stderr()
    took = assert_nothing_left(engine, tree)
    print(f"SIGHUP to the group: the engine exited after {stopped:.2f} s, the rest was gone {took:.2f} s later")
    no_lost_episodes(run_dir)


def test_a_lost_terminal_ends_a_run_with_the_monitor_and_resume_completes(
        start_engine: Callable[..., Engine], tasks: Path, tmp_path: Path) -> None:
    # Before, `run --tui` in a terminal that went away (a tmux session killed) stopped its workers, then never
    # exited: the monitor's writer blocked on the dead terminal while its input thread spun, and the run directory
    # stayed locked, so --resume could not start.
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    cmd = [c for c in engine_cmd(tasks, tmp_path / "runs") if c not in ("--telemetry", "off")] + ["--tui"]
    engine = start_engine(terminal=follower, cmd=cmd)
    os.close(follower)
    screen = bytearray()
    closing = threading.Event()

    def read_screen() -> None:  # the terminal's window: drawn into, as a terminal emulator would read it
        with contextlib.suppress(OSError):
            while not closing.is_set():
                if select.select([leader], [], [], 0.1)[0]:
                    screen.extend(os.read(leader, 65536))

    reader = threading.Thread(target=read_screen, daemon=True)
    reader.start()
    run_dir = wait_in_flight(engine)
    tree = process_tree(engine)
    wait_for(lambda: len(screen) > 1000, 30, "the monitor to draw")
    closing.set()
    reader.join()  # no read is left in progress on the terminal, so closing it is final
    t0 = time.monotonic()
    os.close(leader)  # the terminal goes away: the kernel hangs up its session (SIGHUP)
    try:
        code = engine.proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not exit within 30 s of losing its terminal")
    stopped = time.monotonic() - t0
    assert code == 128 + signal.SIGHUP, (code, bytes(screen[-3000:]).decode(errors="replace"))
    took = assert_nothing_left(engine, tree)
    print(f"lost terminal: the engine exited after {stopped:.2f} s, the rest was gone {took:.2f} s later")
    no_lost_episodes(run_dir)
    resume_and_check(run_dir, tasks, tmp_path)


def test_a_signal_the_engine_ignores_is_ignored_by_its_workers(start_engine: Callable[..., Engine],
                                                               tmp_path: Path) -> None:
    # `nohup webgym-engine run &` and then the terminal closes: the whole group gets SIGHUP, which the engine
    # ignores; the run must go on, its worker too.
    summary = tmp_path / "summary.json"
    engine = start_engine("--summary-json", str(summary), ignore=signal.SIGHUP)
    run_dir = wait_in_flight(engine)
    worker = next(p for p in process_tree(engine) if "browserpool.worker" in cmdline(p))
    os.killpg(engine.pid, signal.SIGHUP)
    assert engine.proc.wait(180) == 0, engine.stderr()
    facts = json.loads(summary.read_text())
    assert facts["worker_restarts"] == 0 and facts["lost"] == 0 and facts["episodes"] == N_TASKS, facts
    no_lost_episodes(run_dir)
    assert "SIGHUP" not in (run_dir / "workers.log").read_text()  # the worker never acted on it
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE  # ended with its engine


def test_a_full_disk_stops_the_run_with_a_clear_message_and_resume_completes(
        small_disk: SmallDisk, tasks: Path, tmp_path: Path) -> None:
    # Before, a run whose disk filled up went on to the end (53 s for the bundled tasks) with every episode's work
    # thrown away: records that could not be written were counted "lost" with no reason given, and the one episode
    # recorded as a "store" error was one --resume then skipped.
    out = small_disk.path / "runs"
    t0 = time.monotonic()
    proc = subprocess.run(engine_cmd(tasks, out), cwd=ROOT, capture_output=True, timeout=240,
                          env={**os.environ, "COLUMNS": "1000"})  # the message unwrapped
    took = time.monotonic() - t0
    said = " ".join((proc.stdout + proc.stderr).decode(errors="replace").split())
    assert proc.returncode == 2, said
    assert "the run stopped" in said and "could not be written" in said and "No space left on device" in said
    [run_dir] = out.glob("run-*")
    assert f"--resume {run_dir}" in said
    records = read_records(run_dir)
    assert len(records) < N_TASKS
    assert not [r for r in records if (r.get("error") or {}).get("kind") == "store"]
    print(f"a full disk: the run stopped after {took:.1f} s with {len(records)} of {N_TASKS} episodes recorded")
    small_disk.resize("64m")
    resume_and_check(run_dir, tasks, tmp_path)


def test_a_run_whose_console_cannot_be_written_goes_on_to_its_records(tasks: Path, tmp_path: Path) -> None:
    # Before, `run 2> run.log` with run.log on a full disk stopped at the first progress line (rc 1), with no record
    # of any episode.
    with open("/dev/full", "wb") as full:  # every write fails with ENOSPC
        proc = subprocess.run(engine_cmd(tasks, tmp_path / "runs"), cwd=ROOT, stdout=full, stderr=full, timeout=240)
    assert proc.returncode == 0
    [run_dir] = (tmp_path / "runs").glob("run-*")
    assert len(read_records(run_dir)) == N_TASKS


def test_silent_connections_to_the_worker_socket_do_not_stop_a_run(tmp_path: Path) -> None:
    # Before, with a soft limit of open files like many systems' 1,024 (here 256, for speed), a peer that opened
    # ~300 connections to `--listen` and never spoke stopped the run within seconds: the store could not open a
    # screenshot file ("Too many open files").
    low = 256
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 8 * low:
        pytest.skip(f"the hard limit of open files ({hard}) leaves nothing to raise the soft one to")
    with socket.socket() as s:  # a free port (the engine binds it a moment later)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tasks = write_tasks(tmp_path / "tasks.jsonl", N_TASKS)
    log = tmp_path / "engine.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            engine_cmd(tasks, tmp_path / "runs", "--listen", f"tcp://127.0.0.1:{port}", "--insecure"), cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env={**os.environ, "COLUMNS": "1000"},
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)))
    silent: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while not silent:
            try:
                silent.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except ConnectionRefusedError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        silent += [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(low + 100)]
        rc = proc.wait(timeout=240)
    finally:
        for s in silent:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = " ".join(log.read_text(errors="replace").split())
    assert rc == 0, said
    [run_dir] = (tmp_path / "runs").glob("run-*")
    records = read_records(run_dir)
    assert len(records) == N_TASKS and len({r["episode_id"] for r in records}) == N_TASKS
