"""A browser worker started by hand (``webgym-engine worker --connect tcp://...``) inside a network namespace, as on
another host: its own /dev/shm (a private tmpfs, so the engine cannot map its frame ring and its frames come inline)
and its own temporary directory (what it leaves there is counted). Started again by :meth:`RemoteWorker.ensure`
when it has exited, as a cluster manager would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from bench.netns import NetNamespace
from bench.proc_stats import browser_of

ROOT = Path(__file__).resolve().parent.parent


class RemoteWorker:
    """One hand-started worker process in ``ns``; ``worker_id`` is the id it says hello with."""

    def __init__(self, ns: NetNamespace, endpoint: str, worker_id: str, server_key: Path, key: Path,
                 work_dir: Path) -> None:
        self.ns = ns
        self.endpoint = endpoint
        self.worker_id = worker_id
        self.server_key, self.key = server_key, key
        self.tmp_dir = work_dir / "tmp"
        self.log_path = work_dir / "remote-worker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exit_codes: list[int] = []

    def start(self) -> None:
        """Start the worker (its stderr goes to ``log_path``)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        worker = [sys.executable, "-m", "cli.main", "worker", "--connect", self.endpoint, "--worker-id", self.worker_id,
                  "--server-key", str(self.server_key), "--key", str(self.key)]
        # A private /dev/shm: the mount lives in a mount namespace of the worker's own.
        shell = 'mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm && exec "$@"'
        argv = self.ns.exec_argv(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh", *worker])
        env = {**os.environ, "TMPDIR": str(self.tmp_dir)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log, start_new_session=True)
        self.starts += 1

    def exited(self) -> int | None:
        """The exit code once the worker has exited (recorded once), else None."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is not None and len(self.exit_codes) < self.starts:
            self.exit_codes.append(code)
        return code

    def ensure(self) -> bool:
        """Start the worker again if it has exited; whether it did."""
        if self.proc is not None and self.exited() is None:
            return False
        self.start()
        return True

    def worker_pid(self) -> int:
        """The worker's Python process (the last of the exec chain ip, unshare, sh), 0 if none."""
        if self.proc is None or self.proc.poll() is not None:
            return 0
        try:
            root = psutil.Process(self.proc.pid)
            for proc in [root, *root.children(recursive=True)]:
                if "cli.main" in " ".join(proc.cmdline()):
                    return proc.pid
        except psutil.Error:
            return 0
        return 0

    def browser_pid(self) -> int:
        """The worker's Chromium, 0 if none."""
        pid = self.worker_pid()
        return browser_of(pid) if pid else 0

    def stop(self, timeout: float = 30.0) -> int | None:
        """Wait up to ``timeout`` for the worker to exit on its own (the engine's Shutdown), then kill its process
        group; returns its exit code if it exited by itself, else None."""
        if self.proc is None:
            return None
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.exited()
        return code

    def leftovers(self) -> list[str]:
        """What the worker's runs left in its temporary directory (files of killed browsers), with their sizes."""
        if not self.tmp_dir.exists():
            return []
        return [f"{p.name} ({_size(p) / 2**20:.1f} MiB)" for p in sorted(self.tmp_dir.iterdir())]


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
