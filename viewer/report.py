"""Build a self-contained static HTML report of a run directory.

Layout (everything under ``RUN_DIR/report/``, regenerated on every build)::

    index.html, episode.html     two static pages (no server needed: they open from file://)
    app.js, style.css            the small app both pages share
    data/summary.js              the run summary, the chart's figures and the chunk count
    data/index-<k>.js            the index rows, CHUNK episodes per file (loaded in parallel)
    data/ep-<n>.js               one episode's steps, rubric and reward evidence (loaded on demand)

Data files are JavaScript that hands its payload to a global (``WG.addIndex(...)``, ``WG.episode(...)``)
rather than JSON: browsers refuse ``fetch()`` of file:// URLs but load ``<script src>`` from them.
Screenshots are referenced from ``RUN_DIR/frames`` as they are (``../frames/...``); actions are drawn
as an SVG overlay, so the stored screenshots stay untouched.

Episode ``n`` is the record's position in ``episodes.jsonl``: records are only ever appended, so numbers
stay stable while a run goes on and a rebuild shows the episodes finished since.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from engine._imgcodec import ImgCodecError, jpeg_size
from engine.store.records import EpisodeRecord, FinalPage, RecordError, RewardRecord
from engine.store.run_dir import read_manifest, read_records
from engine.store.stats import outcome_counts, success_rate

CHUNK = 500  # index rows per data file: 20 files for a 10,000-episode run
STATIC = Path(__file__).with_name("static")
# Step fields the episode page never shows and that can be large (training data, chat history).
_HEAVY_STEP_KEYS = ("messages", "token_ids", "logprobs")


def _js(call: str, *args: Any) -> str:
    """``call(arg, ...);`` with JSON arguments (ASCII only, so the file's encoding cannot matter)."""
    return f"{call}({', '.join(json.dumps(a, separators=(',', ':'), default=str) for a in args)});\n"


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it: rebuilding a running run rewrites only what changed."""
    data = text.encode()
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a browser reloading mid-build never sees half a file


def site_of(website: str, sites_base_url: str | None) -> str:
    """The site an episode runs on: the first path segment on the bundled sites, else the host name."""
    website = website.replace("{SITES}", sites_base_url or "")
    if sites_base_url and website.startswith(sites_base_url):
        return website[len(sites_base_url):].strip("/").split("/")[0] or "/"
    parsed = urlparse(website)
    return parsed.netloc or parsed.path.strip("/").split("/")[0] or website


def summarize(records: list[EpisodeRecord]) -> dict[str, Any]:
    """The run summary table's figures, recomputed from the records.

    ``lost``, peak browser memory and worker restarts live only in the running engine (and the optional
    ``--summary-json``), not in the run directory, so they are not shown.
    """
    counts = Counter(str(r.get("status")) for r in records)
    latencies = [s["timings_ms"]["step_ms"] for r in records for s in r.get("steps", [])
                 if isinstance(s.get("timings_ms", {}).get("step_ms"), int | float)]
    starts = [r["started_at"] for r in records if isinstance(r.get("started_at"), int | float)]
    ends = [r["started_at"] + (r.get("duration_s") or 0) for r in records
            if isinstance(r.get("started_at"), int | float)]
    elapsed = (max(ends) - min(starts)) if starts else 0.0
    steps = sum(len(r.get("steps", [])) for r in records)
    lat = np.asarray(latencies) if latencies else np.zeros(1)
    return {
        "episodes": len(records),
        **outcome_counts(counts),  # succeeded, failed, unrewarded, blocked, errors, judge_pending
        "success_rate": round(success_rate(counts), 4),  # of the rewarded episodes, as the run's summary
        "steps": steps,
        "steps_per_s": round(steps / elapsed, 2) if elapsed > 0 else 0.0,
        "step_latency_p50_ms": round(float(np.percentile(lat, 50)), 1),
        "step_latency_p95_ms": round(float(np.percentile(lat, 95)), 1),
        "elapsed_s": round(elapsed, 2),
    }


def by_difficulty(records: list[EpisodeRecord]) -> list[dict[str, Any]]:
    """Success rate per difficulty, for the chart: ``[{difficulty, episodes, rewarded, succeeded, rate}]``; the
    rate is of the rewarded episodes (success + failure), as the run summary's."""
    groups: dict[Any, Counter[str]] = {}
    for r in records:
        groups.setdefault(r.get("task", {}).get("difficulty"), Counter())[str(r.get("status", ""))] += 1
    return [{"difficulty": d, "episodes": sum(c.values()), "rewarded": c["success"] + c["failure"],
             "succeeded": c["success"], "rate": round(success_rate(c), 4)}
            for d, c in sorted(groups.items(), key=lambda kv: (kv[0] is None, str(kv[0]).zfill(6)))]


def index_row(n: int, r: EpisodeRecord, sites_base_url: str | None) -> dict[str, Any]:
    """One line of the index: what the table shows, sorts and filters on."""
    task = r.get("task", {})
    reward: RewardRecord | dict[str, Any] = r.get("reward") or {}
    error: RecordError | dict[str, str] = r.get("error") or {}
    return {
        "n": n, "id": r.get("episode_id"), "task": task.get("task_name", ""),
        "site": site_of(task.get("website", ""), sites_base_url), "diff": task.get("difficulty"),
        "status": r.get("status"), "reward": reward.get("value"),
        "reason": reward.get("reason") or r.get("judge_error") or "",
        "steps": len(r.get("steps", [])), "dur": r.get("duration_s"),
        # The full message (a traceback, say) is on the episode page; the index keeps its start.
        "error": f"{error.get('kind')}: {str(error.get('message', ''))[:300]}" if error else "",
    }


class _Sizes:
    """Screenshot sizes read from the JPEG headers, each file once (frames are often shared or reused)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.cache: dict[str, list[int] | None] = {}

    def __call__(self, rel: str | None) -> list[int] | None:
        if not rel:
            return None
        if rel not in self.cache:
            try:
                with open(self.run_dir / rel, "rb") as f:
                    head = f.read(65536)  # the SOF marker sits within the first few hundred bytes
                self.cache[rel] = list(jpeg_size(head))
            except (OSError, ImgCodecError):
                self.cache[rel] = None  # missing or not a JPEG: the page says so instead of drawing a marker
        return self.cache[rel]


def _evidence(reward: RewardRecord | None) -> RewardRecord | None:
    """The reward with the judge's prompts left out (the page shows verdicts and reasons, not the prompts)."""
    if not reward:
        return reward
    reward = reward.copy()
    ev = reward.get("evidence")
    if isinstance(ev, dict) and isinstance(ev.get("calls"), list):
        ev = dict(ev)
        ev["calls"] = [{k: v for k, v in c.items() if k not in ("prompt", "messages")}
                       for c in ev["calls"] if isinstance(c, dict)]
        reward["evidence"] = ev
    return reward


def episode_data(n: int, r: EpisodeRecord, sizes: _Sizes, viewport: list[int]) -> dict[str, Any]:
    """Everything the episode page shows of one record; screenshot paths made relative to report/."""
    steps = []
    for s in r.get("steps", []):
        step = {k: v for k, v in s.items() if k not in _HEAVY_STEP_KEYS}
        step["size"] = sizes(s.get("screenshot"))
        steps.append(step)
    final: FinalPage | dict[str, Any] | None = r.get("final")
    if final:
        final = {**final, "size": sizes(final.get("screenshot"))}
    return {
        "n": n, "id": r.get("episode_id"), "task": r.get("task", {}), "status": r.get("status"),
        "reward": _evidence(r.get("reward")), "answer": r.get("answer"), "error": r.get("error"),
        "judge_error": r.get("judge_error"), "policy": r.get("policy"), "mode": r.get("mode"),
        "worker": r.get("worker"), "attempts": r.get("attempts"), "previous_errors": r.get("previous_errors"),
        "duration_s": r.get("duration_s"), "timings_ms": r.get("timings_ms"), "started_at": r.get("started_at"),
        "viewport": viewport, "steps": steps, "final": final,
    }


def build_report(run_dir: str | Path) -> Path:
    """Write (or refresh) ``RUN_DIR/report/`` and return the path of its index.html.

    Safe to run while the run is going: it shows the records written so far.
    """
    run_dir = Path(run_dir)
    t0 = time.monotonic()
    manifest = read_manifest(run_dir)
    config = manifest.get("config", {})
    worker = config.get("worker") or {}
    # Actions are in CSS px of the viewport; screenshots in device px. Both are needed for the scale.
    viewport = [worker.get("viewport_width", 1280), worker.get("viewport_height", 768)]
    records = read_records(run_dir)
    out = run_dir / "report"
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "episode.html", "app.js", "style.css"):
        shutil.copyfile(STATIC / name, out / name)

    sites_base = config.get("sites_base_url") if isinstance(config.get("sites_base_url"), str) else None
    rows = [index_row(n, r, sites_base) for n, r in enumerate(records)]
    chunks = [rows[i:i + CHUNK] for i in range(0, len(rows), CHUNK)]
    for k, chunk in enumerate(chunks):
        _write_if_changed(out / "data" / f"index-{k}.js", _js("WG.addIndex", k, chunk))
    sizes = _Sizes(run_dir)
    for n, r in enumerate(records):
        _write_if_changed(out / "data" / f"ep-{n}.js", _js("WG.episode", episode_data(n, r, sizes, viewport)))
    meta = {
        "run": run_dir.resolve().name, "chunks": len(chunks), "total": len(rows),
        "summary": summarize(records), "by_difficulty": by_difficulty(records),
        "policy": config.get("policy"), "mode": config.get("mode"),
        "interaction": (config.get("agent") or (config.get("policy_info") or {}).get("agent") or {}).get("interaction"),
        "code_version": manifest.get("code_version"), "started_at": manifest.get("started_at"),
        "built_at": time.time(), "build_s": round(time.monotonic() - t0, 3),
    }
    _write_if_changed(out / "data" / "summary.js", _js("WG.setSummary", meta))
    return out / "index.html"
