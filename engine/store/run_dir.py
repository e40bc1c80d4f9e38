"""The run directory: a manifest, one JSONL record per episode, and step screenshots as JPEG files.

Layout::

    RUN_DIR/manifest.json          format version, config, code version, start time
    RUN_DIR/episodes.jsonl         exactly one record per episode, appended atomically
    RUN_DIR/judgements.jsonl       judge verdicts, appended as they come (the latest per episode counts)
    RUN_DIR/frames/<episode>/NNN.jpg   the worker's JPEG bytes, never re-encoded (written off the event loop;
                                       an episode's record is appended once its files are there;
                                       <episode>: frames_name)

A record is one ``write`` of one line on a file opened with O_APPEND, so it is either there whole or
not at all (a line a full disk cuts short is cut off at once); a torn last line (the process killed inside the
write) is cut off when the run resumes.
The records' types, their format version and their validation live in :mod:`engine.store.records`: a reader
refuses a run directory of another record format, or a complete line that is not a record, with a
:class:`engine.store.records.RecordFormatError` that names the file and the line.

A write into the run directory that fails (a full disk, a quota, a read-only or failing file system) fails the
store for the rest of the run (:class:`StoreFailed`): the engine core stops the run, and the episodes without a
record are the ones ``--resume`` runs again.

An episode rewarded by the judge is recorded with status ``judge_pending`` as soon as it ends, so the
rollout never waits for the judge; its verdict lands in ``judgements.jsonl`` later, and
:func:`read_records` returns the records with their latest verdicts merged in (:func:`merge_judgement`).
Records of an older readable format come back mapped to the current one (:func:`engine.store.records.upgrade_record`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from engine import json_input
from engine._filewrite import write_files
from engine._version import __version__
from engine.store.frame_writer import FrameWriter
from engine.store.records import (
    FORMAT_VERSION,
    EpisodeRecord,
    Judgement,
    RecordFormatError,
    check_version,
    decode_judgement,
    decode_record,
    judge_blocked_error,
    reward_status,
)
from engine.store.runlock import lock_run_dir
from engine.web.redact import mask_text, redact_tree

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_PLAIN_EPISODE = re.compile(r"[A-Za-z0-9._-]{1,100}#\d{1,9}")


def frames_name(episode_id: str) -> str:
    """The directory of an episode's screenshots under ``frames/``. A plain id (``TASK#N``, the task id made of
    letters, digits and ``._-``, at most 100 of them) gives ``TASK_N``. Any other id gives a safe prefix and a hash
    of the whole id: ids that differ only in other characters (``a/b`` and ``a_b``) must not share a directory, and
    a file name has at most 255 bytes."""
    if _PLAIN_EPISODE.fullmatch(episode_id):
        return episode_id.replace("#", "_")
    digest = hashlib.sha256(episode_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_SAFE.sub('_', episode_id)[:64]}-{digest}"


class FrameRefError(ValueError):
    """A record's screenshot reference that leads out of its run directory's ``frames/`` (see :func:`frame_file`)."""


def frame_file(run_dir: str | Path, ref: Any) -> Path:
    """The file of a record's screenshot reference (``frames/<episode>/NNN.jpg``, relative to the run directory).

    A run directory may come from elsewhere (a shared dataset of trajectories), and its records must not make the
    judge send, or training read, any other file: a reference that leads out of ``frames/`` (an absolute path,
    ``..``, a link that points outside) raises FrameRefError (a ValueError). ``frames/`` itself may be a link
    (frames kept on another disk)."""
    frames = (Path(run_dir) / "frames").resolve()
    if not isinstance(ref, str) or not ref.startswith("frames/"):
        raise FrameRefError(f"a screenshot reference outside the run directory's frames/: {str(ref)[:200]!r}")
    path = (frames / ref.removeprefix("frames/")).resolve()
    if not path.is_relative_to(frames):
        raise FrameRefError(f"a screenshot reference outside the run directory's frames/: {ref[:200]!r}")
    return path


class StoreFailed(OSError):
    """The run directory could not be written. The run stops rather than go on: an episode whose record or
    screenshots cannot be stored has no record, so that ``--resume`` runs it again once there is room (a ``store``
    error record would make it skip a task that never failed)."""


def episode_key(task_id: str, sample: int) -> str:
    """The identity of an episode within a run: a task and its sample number."""
    return f"{task_id}#{sample}"


def code_version() -> str:
    """The package version plus the git commit when run from a checkout."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            return f"{__version__}+g{rev.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return __version__


class RunStore:
    """Writes (and, for resume, reads) one run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.frames_dir = self.dir / "frames"
        self._dir = str(self.dir)
        self.episodes_path = self.dir / "episodes.jsonl"
        self.judgements_path = self.dir / "judgements.jsonl"
        try:
            self.frames_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreFailed(f"the run directory {self.dir} could not be written (frames/: {exc})") from exc
        # One writer per run directory (RunDirBusy otherwise), taken before the torn-tail repair below: cutting a
        # line another writer is appending would lose its record.
        self._lock = lock_run_dir(self.dir)
        try:
            _repair_tail(self.episodes_path)
            self._fd = os.open(self.episodes_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            self._lock.release()
            raise StoreFailed(f"the run directory {self.dir} could not be written (episodes.jsonl: {exc})") from exc
        self._judgements_fd: int | None = None
        self.failure: StoreFailed | None = None  # the first write that failed; nothing is appended after it
        self.failed = asyncio.Event()  # set with ``failure``: the core stops the run
        # A screenshot that could not be written fails the store at once, not when its episode ends.
        self._frames = FrameWriter(on_error=self._screenshot_failed)

    def _fail(self, what: str, error: object) -> StoreFailed:
        """Fail the store (once: later failures keep the first's message); returns the error to raise."""
        if self.failure is None:
            self.failure = StoreFailed(f"the run directory {self.dir} could not be written ({what}: {error})")
            self.failed.set()
        return self.failure

    def raise_if_failed(self) -> None:
        """Raise :class:`StoreFailed` once a write into the run directory has failed: nothing more is stored."""
        if self.failure is not None:
            raise self.failure

    def _screenshot_failed(self, error: str) -> None:
        self._fail("a screenshot", error)

    def write_manifest(self, config: dict[str, Any]) -> None:
        """Write manifest.json atomically (temp file + rename); keeps the first start time on resume.

        Credentials are masked first (:func:`engine.web.redact.redact_tree`): userinfo and secret-named query
        parameters of every URL in it (base URLs, the judge's, the task websites...), and the values of
        secret-named keys."""
        path = self.dir / "manifest.json"
        started = time.time()
        with contextlib.suppress(RecordFormatError):  # unreadable: the run starts its record of time afresh
            started = read_manifest(self.dir).get("started_at", started)
        manifest = {"format_version": FORMAT_VERSION, "code_version": code_version(),
                    "started_at": started, "updated_at": time.time(),
                    "config": redact_tree(json.loads(json.dumps(config, default=str)))}
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(manifest, indent=2, default=str))
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise self._fail("manifest.json", exc) from exc

    def frame_path(self, episode_id: str, index: int) -> Path:
        return self.frames_dir / frames_name(episode_id) / f"{index:03d}.jpg"

    def _frame_rel(self, episode_id: str, index: int) -> str:
        # Plain strings, not Path objects: this runs once per step in the engine process.
        return f"frames/{frames_name(episode_id)}/{index:03d}.jpg"

    def write_frame(self, episode_id: str, index: int, jpeg: bytes | memoryview) -> str:
        """Store one screenshot as given, now; returns its path relative to the run directory. Raises
        :class:`StoreFailed` when it cannot be (or the store failed before)."""
        self.raise_if_failed()
        rel = self._frame_rel(episode_id, index)
        [error] = write_files([(os.path.join(self._dir, rel), jpeg, index == 0)])
        if error:
            raise self._fail("a screenshot", error)
        return rel

    def queue_frame(self, episode_id: str, index: int, jpeg: bytes | memoryview,
                    done: Callable[[], None] | None = None) -> str:
        """Store one screenshot off the event loop (the rollouts' path); returns its path relative to the run
        directory at once. ``jpeg`` stays untouched until ``done`` runs on the loop (e.g. a worker's slot, handed
        back then). Await :meth:`frames_landed` before publishing the episode's record."""
        rel = self._frame_rel(episode_id, index)
        self._frames.submit(episode_id, os.path.join(self._dir, rel), jpeg, index == 0, done)
        return rel

    async def frame_room(self) -> float:
        """Wait while too many screenshots are queued to be written (a disk slower than the run); the seconds
        waited. Rollouts call it before they ask for a screenshot."""
        if self._frames.queued <= self._frames.max_queued:
            return 0.0
        t = time.monotonic()
        await self._frames.room()
        return time.monotonic() - t

    async def frames_landed(self, episode_id: str) -> None:
        """Wait until the episode's queued screenshots are written; raises :class:`StoreFailed` when one could not
        be (or the store failed before)."""
        errors = await self._frames.landed(episode_id)
        if errors:
            raise self._fail("a screenshot", "; ".join(errors))
        self.raise_if_failed()

    def append(self, record: EpisodeRecord) -> None:
        """Append one episode record as a single line (:func:`_append_line`); raises :class:`StoreFailed` when it
        cannot be (or the store failed before)."""
        self.raise_if_failed()
        try:
            _append_line(self._fd, record)
        except OSError as exc:
            raise self._fail("a record", exc) from exc

    def append_judgement(self, judgement: Judgement) -> None:
        """Append one judge verdict (:class:`~engine.store.records.Judgement`: ``episode_id``, ``reward``, ``error``,
        ``judged_at``, ``judge_ms``); an error message (which may quote the judge's URL) has its credentials
        masked."""
        if isinstance(error := judgement.get("error"), str):
            judgement = {**judgement, "error": mask_text(error)}
        self.raise_if_failed()
        try:
            if self._judgements_fd is None:
                _repair_tail(self.judgements_path)
                self._judgements_fd = os.open(self.judgements_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _append_line(self._judgements_fd, judgement)
        except OSError as exc:
            raise self._fail("a verdict", exc) from exc

    def close(self) -> None:
        """Write the screenshots still queued, close the files, release the run directory (once: a second call,
        as when a start that failed closed it already, does nothing)."""
        if self._fd < 0:
            return
        self._frames.close()
        os.close(self._fd)
        self._fd = -1
        if self._judgements_fd is not None:
            os.close(self._judgements_fd)
            self._judgements_fd = None
        self._lock.release()

    def remove_unrecorded_frames(self, records: list[EpisodeRecord]) -> list[str]:
        """Remove ``frames/<episode>/`` of every episode without a record (an attempt a killed or interrupted run
        left behind), so that the episode's rerun starts from an empty directory; returns the names removed.
        ``records``: the run's records (:func:`read_records`). Only for the run directory's writer."""
        keep = {frames_name(r["episode_id"]) for r in records if isinstance(r.get("episode_id"), str)}
        # And wherever the records' screenshots are: a run directory written before an episode's directory was named
        # as it is now.
        keep.update(path.split("/")[1] for r in records for step in r.get("steps") or ()
                    if isinstance(path := step.get("screenshot"), str) and path.count("/") == 2)
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.frames_dir):
                if entry.name not in keep and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.name)
        return removed


def _append_line(fd: int, obj: EpisodeRecord | Judgement) -> None:
    """One line in one write. A disk that fills up mid-line writes less: the rest is written again, which either
    completes the line or fails with the reason (ENOSPC, EDQUOT, EFBIG), and then the part written is cut off: a
    reader never sees half a line."""
    data = memoryview((json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode())
    written = 0
    while written < len(data):
        try:
            written += os.write(fd, data[written:])
        except OSError:
            if written:  # never leave half a line behind
                os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
            raise


def _repair_tail(path: Path) -> None:
    """Cut a torn last line left by a killed process."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


_R = TypeVar("_R", EpisodeRecord, Judgement)


def _read_lines(path: Path, decode: Callable[..., _R]) -> list[_R]:
    """The validated records of a JSONL file (``decode``: :func:`~engine.store.records.decode_record` or
    :func:`~engine.store.records.decode_judgement`). Its last line, when it has no newline and is not JSON, is a
    torn write (a writer killed inside it, or still writing) and is left out; any other line that is not a
    record raises :class:`~engine.store.records.RecordFormatError`."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    last = len(lines) - 1  # b"" when the file ends with a newline
    out = []
    for i, line in enumerate(lines):
        if line.strip():
            try:
                out.append(decode(line, path=path, line_no=i + 1))
            except RecordFormatError as exc:
                if exc.malformed and i == last:  # a torn last line
                    continue
                raise
    return out


def read_judgements(run_dir: str | Path) -> dict[str, Judgement]:
    """The latest judge verdict of each episode."""
    return {j["episode_id"]: j for j in _read_lines(Path(run_dir) / "judgements.jsonl", decode_judgement)}


def merge_judgement(record: EpisodeRecord, judgement: Judgement) -> EpisodeRecord:
    """The record as the verdict leaves it: its status the verdict's (:func:`~engine.store.records.reward_status`:
    success, failure, unrewarded, or blocked with the judge's ``judge_blocked`` error), or still pending with the
    judge's error."""
    merged: EpisodeRecord = {**record, "judged_at": judgement.get("judged_at")}
    reward = judgement.get("reward")
    if reward is not None:
        merged["reward"] = reward
        merged["status"] = reward_status(reward)
        if merged["status"] == "blocked":  # what blocked it, where every blocked record says so
            merged["error"] = judge_blocked_error(reward)
        merged.pop("judge_error", None)
    else:
        merged["judge_error"] = judgement.get("error")
    return merged


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's ``manifest.json`` ({} when it has none). Raises
    :class:`~engine.store.records.RecordFormatError` when it is not JSON, not an object (with a ``config`` object), or
    of a record format this code does not read."""
    path = Path(run_dir) / "manifest.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a folder of that name, no permission
        raise RecordFormatError(f"{path} cannot be read: {exc}") from None
    try:
        manifest = json_input.loads(raw)
    except ValueError as exc:  # also: nested too deep, a number too long
        raise RecordFormatError(f"{path} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config", {}), dict):
        raise RecordFormatError(f"{path} is not a run manifest (a JSON object, its config an object)")
    version = manifest.get("format_version")
    check_version(version if isinstance(version, int) and not isinstance(version, bool) else None, str(path))
    return manifest


def read_records(run_dir: str | Path) -> list[EpisodeRecord]:
    """All complete records of a run (a torn last line is ignored), validated, with judge verdicts merged in.
    Raises :class:`~engine.store.records.RecordFormatError` for a run directory of another record format or a
    complete line that is not a record."""
    records = _read_lines(Path(run_dir) / "episodes.jsonl", decode_record)
    judgements = read_judgements(run_dir)
    if not judgements:
        return records
    return [merge_judgement(r, judgements[r["episode_id"]]) if r.get("episode_id") in judgements else r
            for r in records]


def finished_keys(run_dir: str | Path, records: list[EpisodeRecord] | None = None) -> set[str]:
    """Episodes that already have a record (what ``--resume`` skips); ``records``: the run's records, if read."""
    return {episode_key(r["task"]["task_id"], r.get("sample", 0))
            for r in (read_records(run_dir) if records is None else records)}
