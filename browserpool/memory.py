"""Proportional set size (PSS) of process trees, read from /proc (summed RSS over-counts ~5x)."""

from __future__ import annotations

import psutil


def pss_bytes(pid: int) -> int:
    """PSS of one process from /proc/PID/smaps_rollup, 0 when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss_bytes(root_pid: int) -> int:
    """PSS of a process and all its descendants."""
    if root_pid <= 0:
        return 0
    try:
        root = psutil.Process(root_pid)
        pids = [root_pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.Error:
        return 0
    return sum(pss_bytes(p) for p in pids)
