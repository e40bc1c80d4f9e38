"""Every task exactly one record: a run directory's ``episodes.jsonl`` read line by line and checked against the
episode ids that entered the run (missing, duplicated and unexpected ids; outcomes, error kinds, retried episodes)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any


def audit_records(run_dir: Path, started: list[str], cut: Collection[str] = ()) -> dict[str, Any]:
    """Check ``run_dir/episodes.jsonl`` against the ids of the episodes ``started``. A line that does not parse
    counts as ``torn``; every other line is a record of the id it names. ``cut``: episodes in flight when the run
    was interrupted, which may end with one record or none (an interrupted episode writes none, so that a resumed
    run runs it again)."""
    ids: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    error_kinds: Counter[str] = Counter()
    retried: Counter[str] = Counter()  # kinds of the errors that made an episode start again
    torn = 0
    path = run_dir / "episodes.jsonl"
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                torn += 1
                continue
            ids[rec["episode_id"]] += 1
            statuses[rec["status"]] += 1
            if rec.get("error"):
                error_kinds[rec["error"]["kind"]] += 1
            for err in rec.get("previous_errors") or []:
                retried[err["kind"]] += 1
    expected = Counter(started)
    duplicated = sorted(i for i, n in ids.items() if n > 1)
    missing = sorted(set(expected) - set(ids) - set(cut))
    unexpected = sorted(set(ids) - set(expected))
    return {"started": len(started), "started_unique": len(expected), "records": sum(ids.values()),
            "unique_records": len(ids), "missing": len(missing), "duplicated": len(duplicated),
            "unexpected": len(unexpected), "cut_without_record": len(set(cut) - set(ids)),
            "torn_lines": torn, "statuses": dict(statuses),
            "error_kinds": dict(error_kinds), "retries_by_kind": dict(retried),
            "examples": {"missing": missing[:20], "duplicated": duplicated[:20], "unexpected": unexpected[:20]},
            "exactly_one_each": not (missing or duplicated or unexpected or torn) and len(expected) == len(started)}


def recorded_ids(run_dir: Path) -> set[str]:
    """The episode ids ``run_dir/episodes.jsonl`` holds a record of (torn lines skipped)."""
    ids = set()
    with (run_dir / "episodes.jsonl").open(encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                ids.add(json.loads(line)["episode_id"])
    return ids
