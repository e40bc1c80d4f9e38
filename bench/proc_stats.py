"""Memory and CPU time of a running engine's processes, by kind: the engine process itself, the bundled-site server,
and per browser worker its Python process, its Playwright driver and its Chromium (the browser's whole process tree).

Blocking (it reads ``/proc/PID/smaps_rollup``, ~2 ms of kernel time per process): call it from a thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from browserpool.memory import pss_bytes, tree_pss_bytes
from browserpool.pool import BrowserPool

MiB = 2**20
KINDS = ("engine", "sites", "worker", "driver", "browser")  # the process kinds a sample reports


@dataclass
class WorkerSample:
    """One worker's processes: the memory (MiB) of its Python process (USS and PSS), its Playwright driver (PSS) and
    its Chromium process tree (PSS); their CPU seconds since the worker started (the browser's: the rest of the
    worker's tree, browsers that ended included); the pids, so that a restart or a browser recycle shows."""

    worker_id: str
    pid: int
    browser_pid: int
    cpu_worker_s: float
    cpu_driver_s: float
    cpu_browser_s: float
    worker_uss: float
    worker_pss: float
    driver_pss: float
    browser_pss: float
    browser_processes: int


def _uss_rss(proc: psutil.Process) -> tuple[float, float]:
    try:
        info = proc.memory_full_info()
    except psutil.Error:
        return 0.0, 0.0
    return info.uss / MiB, info.rss / MiB


def own_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds (user and system) of one process, its children left out."""
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process, by the thread's name (Python's, or the OS's for native threads such
    as ZeroMQ's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for th in psutil.Process().threads():
        name = names.get(th.id)
        if name is None:
            with contextlib.suppress(OSError):
                name = Path(f"/proc/self/task/{th.id}/comm").read_text().strip()
        key = name or str(th.id)
        out[key] = out.get(key, 0.0) + th.user_time + th.system_time
    return out


def named_thread_cpu_s(name: str) -> float:
    """CPU seconds of this process's Python thread called ``name`` (its own clock: exact, where ``/proc`` counts
    10 ms ticks); 0.0 when no such thread runs."""
    for t in threading.enumerate():
        if t.name == name and t.ident is not None:
            with contextlib.suppress(OSError):  # it ended meanwhile
                return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return 0.0


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of a process and its descendants, those that ended and were reaped included
    (a renderer that lived for one context still counts)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _tree_size(pid: int) -> int:
    try:
        return 1 + len(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return 0


def browser_of(worker_pid: int) -> int:
    """The root Chromium process under a worker (for a worker the pool did not spawn, whose browser pid it does not
    use), 0 if none."""
    try:
        procs = psutil.Process(worker_pid).children(recursive=True)
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            parent = proc.parent()
            if "chrom" in proc.name() and "chrom" not in (parent.name() if parent else ""):
                return proc.pid
        except psutil.Error:
            continue
    return 0


def worker_sample(worker_id: str, pid: int, browser_pid: int) -> WorkerSample:
    """The memory and CPU time of one worker's processes. The driver is every direct child of the worker besides
    the browser tree (the Playwright driver, and the shared-memory resource tracker, which is a few MiB)."""
    browser_pid = browser_pid or browser_of(pid)
    try:
        worker = psutil.Process(pid)
        children = [c for c in worker.children() if c.pid != browser_pid]
    except psutil.Error:
        return WorkerSample(worker_id, pid, browser_pid, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    uss, _ = _uss_rss(worker)
    driver = sum(pss_bytes(c.pid) for c in children)
    browser = tree_pss_bytes(browser_pid) if browser_pid else 0
    cpu_worker = own_cpu_s(worker)
    cpu_driver = sum(own_cpu_s(c) for c in children)
    cpu_browser = max(0.0, tree_cpu_s(pid) - cpu_worker - cpu_driver)
    return WorkerSample(worker_id, pid, browser_pid, round(cpu_worker, 2), round(cpu_driver, 2),
                        round(cpu_browser, 2), round(uss, 2), round(pss_bytes(pid) / MiB, 2), round(driver / MiB, 2),
                        round(browser / MiB, 2), _tree_size(browser_pid) if browser_pid else 0)


def sites_pid() -> int:
    """The bundled-site server started by this process (a child running ``engine.sites.server``), 0 if none."""
    for child in psutil.Process().children():
        try:
            if "engine.sites.server" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return 0


def sample(pool: BrowserPool, extra_workers: dict[str, int] | None = None) -> dict[str, Any]:
    """One sample of every process kind (MiB): the engine's USS and RSS, the site server's USS, and each live
    worker of ``pool`` (plus ``extra_workers``: worker id -> pid of workers started by hand on this host), with the
    sums per kind under ``kinds``; and the CPU seconds so far of the engine process and of the workers' trees."""
    me = psutil.Process(os.getpid())
    engine_uss, engine_rss = _uss_rss(me)
    engine_cpu = me.cpu_times()
    sites = sites_pid()
    sites_uss = _uss_rss(psutil.Process(sites))[0] if sites else 0.0
    targets = {h.worker_id: (h.pid, h.browser_pid) for h in pool.alive_workers() if h.proc is not None}
    for wid, pid in (extra_workers or {}).items():
        targets[wid] = (pid, 0)
    workers = [worker_sample(wid, pid, bpid) for wid, (pid, bpid) in targets.items() if pid]
    kinds = {"engine": round(engine_uss, 2), "sites": round(sites_uss, 2),
             "worker": round(sum(w.worker_pss for w in workers), 2),
             "driver": round(sum(w.driver_pss for w in workers), 2),
             "browser": round(sum(w.browser_pss for w in workers), 2)}
    return {"engine_uss": round(engine_uss, 2), "engine_rss": round(engine_rss, 2), "sites_uss": round(sites_uss, 2),
            "engine_cpu_s": round(engine_cpu.user + engine_cpu.system, 2),
            "workers_cpu_s": {k: round(sum(getattr(w, f"cpu_{k}_s") for w in workers), 2)
                              for k in ("worker", "driver", "browser")},
            "workers": [asdict(w) for w in workers],
            "kinds": kinds}
