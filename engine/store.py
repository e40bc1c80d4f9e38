"""The run directory: a manifest, one JSONL record per episode, and step screenshots as JPEG files.

Layout::

    RUN_DIR/manifest.json          format version, config, code version, start time
    RUN_DIR/episodes.jsonl         exactly one record per episode, appended atomically
    RUN_DIR/judgements.jsonl       judge verdicts, appended as they come (the latest per episode counts)
    RUN_DIR/frames/<episode>/NNN.jpg   the worker's JPEG bytes, never re-encoded

A record is one ``write`` of one line on a file opened with O_APPEND, so it is either there whole or
not at all; a torn last line (the process killed inside the write) is cut off when the run resumes.

An episode rewarded by the judge is recorded with status ``judge_pending`` as soon as it ends, so the
rollout never waits for the judge; its verdict lands in ``judgements.jsonl`` later, and
:func:`read_records` returns the records with their latest verdicts merged in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import engine
from engine.redact import mask_text, redact_tree
from engine.runlock import lock_run_dir

FORMAT_VERSION = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def episode_key(task_id: str, sample: int) -> str:
    """The identity of an episode within a run: a task and its sample number."""
    return f"{task_id}#{sample}"


def code_version() -> str:
    """The package version plus the git commit when run from a checkout."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            return f"{engine.__version__}+g{rev.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return engine.__version__


class RunStore:
    """Writes (and, for resume, reads) one run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.frames_dir = self.dir / "frames"
        self._dir = str(self.dir)
        self.episodes_path = self.dir / "episodes.jsonl"
        self.frames_dir.mkdir(parents=True, exist_ok=True)
        self.judgements_path = self.dir / "judgements.jsonl"
        # One writer per run directory (RunDirBusy otherwise), taken before the torn-tail repair below: cutting a
        # line another writer is appending would lose its record.
        self._lock = lock_run_dir(self.dir)
        _repair_tail(self.episodes_path)
        self._judgements_fd: int | None = None
        self._fd = os.open(self.episodes_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write_manifest(self, config: dict[str, Any]) -> None:
        """Write manifest.json atomically (temp file + rename); keeps the first start time on resume.

        Credentials are masked first (:func:`engine.redact.redact_tree`): userinfo and secret-named query
        parameters of every URL in it (base URLs, the judge's, the task websites...), and the values of
        secret-named keys."""
        path = self.dir / "manifest.json"
        started = time.time()
        if path.exists():
            with contextlib.suppress(OSError, ValueError):
                started = json.loads(path.read_text()).get("started_at", started)
        manifest = {"format_version": FORMAT_VERSION, "code_version": code_version(),
                    "started_at": started, "updated_at": time.time(),
                    "config": redact_tree(json.loads(json.dumps(config, default=str)))}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, default=str))
        os.replace(tmp, path)

    def frame_path(self, episode_id: str, index: int) -> Path:
        return self.frames_dir / _SAFE.sub("_", episode_id) / f"{index:03d}.jpg"

    def write_frame(self, episode_id: str, index: int, jpeg: bytes | memoryview) -> str:
        """Store one screenshot as given; returns its path relative to the run directory."""
        # Plain strings, not Path objects: this runs once per step in the engine process.
        rel = f"frames/{_SAFE.sub('_', episode_id)}/{index:03d}.jpg"
        path = os.path.join(self._dir, rel)
        if index == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(jpeg)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return rel

    def append(self, record: dict[str, Any]) -> None:
        """Append one episode record as a single line in a single write."""
        _append_line(self._fd, self.episodes_path, record)

    def append_judgement(self, judgement: dict[str, Any]) -> None:
        """Append one judge verdict (``episode_id``, ``status``, ``reward``, ``error``, ``judged_at``); an error
        message (which may quote the judge's URL) has its credentials masked."""
        if isinstance(judgement.get("error"), str):
            judgement = {**judgement, "error": mask_text(judgement["error"])}
        if self._judgements_fd is None:
            _repair_tail(self.judgements_path)
            self._judgements_fd = os.open(self.judgements_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _append_line(self._judgements_fd, self.judgements_path, judgement)

    def close(self) -> None:
        os.close(self._fd)
        if self._judgements_fd is not None:
            os.close(self._judgements_fd)
        self._lock.release()

    def remove_unrecorded_frames(self, records: list[dict[str, Any]]) -> list[str]:
        """Remove ``frames/<episode>/`` of every episode without a record (an attempt a killed or interrupted run
        left behind), so that the episode's rerun starts from an empty directory; returns the names removed.
        ``records``: the run's records (:func:`read_records`). Only for the run directory's writer."""
        keep = {_SAFE.sub("_", r["episode_id"]) for r in records if isinstance(r.get("episode_id"), str)}
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.frames_dir):
                if entry.name not in keep and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.name)
        return removed


def _append_line(fd: int, path: Path, obj: dict[str, Any]) -> None:
    data = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
    written = os.write(fd, data)
    if written != len(data):  # a full disk: never leave half a line behind
        os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
        raise OSError(f"short write of a record to {path}")


def _repair_tail(path: Path) -> None:
    """Cut a torn last line left by a killed process."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line
                continue
    return out


def read_judgements(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The latest judge verdict of each episode."""
    return {j["episode_id"]: j for j in _read_lines(Path(run_dir) / "judgements.jsonl")}


def merge_judgement(record: dict[str, Any], judgement: dict[str, Any]) -> dict[str, Any]:
    """The record as the verdict leaves it: rewarded (success/failure), or still pending with the judge's error."""
    merged = {**record, "judged_at": judgement.get("judged_at")}
    if judgement.get("reward") is not None:
        merged["reward"] = judgement["reward"]
        merged["status"] = "success" if judgement["reward"]["value"] == 1.0 else "failure"
        merged.pop("judge_error", None)
    else:
        merged["judge_error"] = judgement.get("error")
    return merged


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """All complete records of a run (a torn last line is ignored), with judge verdicts merged in."""
    records = _read_lines(Path(run_dir) / "episodes.jsonl")
    judgements = read_judgements(run_dir)
    if not judgements:
        return records
    return [merge_judgement(r, judgements[r["episode_id"]]) if r.get("episode_id") in judgements else r
            for r in records]


def finished_keys(run_dir: str | Path, records: list[dict[str, Any]] | None = None) -> set[str]:
    """Episodes that already have a record (what ``--resume`` skips); ``records``: the run's records, if read."""
    return {episode_key(r["task"]["task_id"], r.get("sample", 0))
            for r in (read_records(run_dir) if records is None else records)}
