"""Soak: many short episodes of the bundled tasks through the engine core (``EngineCore.run_plan``, the path of
``webgym-engine run``), sampling the memory of every process kind over the run: does anything grow with the number
of episodes?

Every few seconds (``--sample-s``), a thread samples the engine process (USS and RSS), the bundled-site server
(USS), and per browser worker its Python process (PSS), its Playwright driver (PSS) and its Chromium process tree
(PSS), with the episodes done and the steps so far (``bench/proc_stats.py``). Reported: each kind's memory after
the warm-up (the first ``--warmup`` episodes, default a tenth of the run) and at the end, and the least-squares
slope of each series after the warm-up, in MiB per 1,000 episodes; steps/s over time; browser recycles and
contexts discarded for their heap (the workers' log), worker restarts, errors, and every started episode checked
against ``episodes.jsonl`` (exactly one record each).

The episodes are short on purpose (the instant policy, ``--step-caps 1,1,1``): what is soaked is the per-episode
life cycle (lease, page load, context reset and reuse, records, frames), 10,000 times. The few bundled tasks with
their own longer ``max_steps`` get the run's cap too (``--keep-task-caps`` keeps theirs).

    python -m bench.soak [--episodes 10000] [--concurrency 32] [--workers 2] [--policy instant]
                         [--step-caps 1,1,1] [--sample-s 5] [--null-workers] [--trace-growth N]
                         [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import proc_stats
from bench.growth_trace import GrowthTrace
from bench.null_worker import null_workers
from bench.record_audit import audit_records, recorded_ids
from bench.report import row, slope, write_result
from engine.clients.runner import plan_episodes
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.core.gc_tuning import tune_for_engine_process
from engine.episode.status import EpisodeStatus
from engine.sites.server import SiteServer
from engine.store.records import EpisodeRecord
from engine.store.run_dir import episode_key
from engine.tasks.loading import load_tasks
from engine.tasks.schema import BUNDLED_TASKS
from policy.registry import make_policy

# Goals for the slopes after warm-up (MiB per 1,000 episodes), and why (docs/measured.md repeats this):
# - engine: a long training run does a million episodes; 1 MiB per 1,000 is 1 GiB over such a run, which one
#   machine still holds, and anything kept per episode by mistake (a record of a few KiB, a frame of ~100 KiB)
#   shows far above it.
# - each other kind, per process: 1 MiB per 1,000 episodes as well for the worker and its driver (they hold
#   nothing per episode once it is closed); Chromium's renderers come and go with contexts, so its series is
#   noisy: 5 MiB per 1,000 episodes per browser, and the worker's memory cap recycles a browser anyway.
SLOPE_GOALS = {"engine": 1.0, "sites": 1.0, "worker": 1.0, "driver": 1.0, "browser": 5.0}
KIND_LABELS = {"engine": "engine process (USS)", "sites": "site server (USS)", "worker": "worker processes (PSS)",
               "driver": "Playwright drivers (PSS)", "browser": "Chromium trees (PSS)"}
CPU_LABELS = {"engine": "engine process", "worker": "worker processes", "driver": "Playwright drivers",
              "browser": "Chromium"}
PER_WORKER = ("worker", "driver", "browser")  # kinds summed over workers: their goals scale with the workers
LOG_COUNTS = {"browser_recycles": re.compile(r"browser recycled in"),
              "contexts_over_memory": re.compile(r"discarded, not reused"),
              "browsers_over_memory": re.compile(r"draining, then recycling")}


def soak_tasks(dest: Path, keep_task_caps: bool) -> Path:
    """The bundled tasks as a task file for the soak: without their own ``max_steps`` unless kept, so that the
    run's step caps hold for every episode."""
    rows = [json.loads(line) for line in Path(BUNDLED_TASKS).read_text().splitlines() if line.strip()]
    if not keep_task_caps:
        for r in rows:
            r.pop("max_steps", None)
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


class Sampler:
    """Samples memory, episodes and steps every ``interval`` seconds (the reading in a thread) until stopped.

    Each sample goes to a JSON-lines file as it is taken, not into a list: the sampler runs in the engine's process,
    and a list of samples (~3 KB each) would grow that process by itself, which is what the soak measures."""

    def __init__(self, core: EngineCore, interval: float, path: Path) -> None:
        self.core = core
        self.interval = interval
        self.path = path
        self.t0 = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def samples(self) -> list[dict[str, Any]]:
        """Every sample taken so far, read back from the file."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop sampling, after a last sample (once: a second call does nothing)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.take()

    async def take(self) -> None:
        stats = self.core.stats
        mem = await asyncio.to_thread(proc_stats.sample, self.core.pool)
        sample = {"t": round(time.monotonic() - self.t0, 2), "episodes": stats.done, "steps": stats.steps,
                  "errors": stats.outcomes["error"], **mem}
        with self.path.open("a") as f:
            f.write(json.dumps(sample) + "\n")

    async def _loop(self) -> None:
        while True:
            t = time.monotonic()
            await self.take()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - t)))


def series_figures(samples: list[dict[str, Any]], warmup: int, workers: int) -> dict[str, dict[str, float | None]]:
    """Per kind: memory at the first sample past the warm-up and at the last, and the slope after the warm-up."""
    after = [s for s in samples if s["episodes"] >= warmup] or samples[-1:]
    xs = [s["episodes"] / 1000 for s in after]

    def series(value: Callable[[dict[str, Any]], float], per_process: int) -> dict[str, float | None]:
        ys = [value(s) for s in after]
        fit = slope(xs, ys)
        return {"after_warmup_mib": ys[0], "end_mib": ys[-1], "peak_mib": max(value(s) for s in samples),
                "slope_mib_per_1k": None if fit is None else round(fit, 3), "per_process": per_process}

    def of_kind(kind: str) -> Callable[[dict[str, Any]], float]:
        return lambda s: s["kinds"][kind]

    out = {kind: series(of_kind(kind), workers if kind in PER_WORKER else 1) for kind in proc_stats.KINDS}
    # The engine's USS moves in steps of a few MiB, up and back down, with no change in its RSS: pages it shares
    # with another process, or stops sharing. Its RSS says what its own memory does; shown beside, with no goal.
    out["engine_rss"] = series(lambda s: s["engine_rss"], 1)
    return out


CPU_KINDS = ("engine", "worker", "driver", "browser")


def cpu_per_episode(samples: list[dict[str, Any]], warmup: int) -> dict[str, float | None]:
    """CPU ms per episode after the warm-up, per process kind (the workers' kinds summed over the workers), from the
    first sample past the warm-up to the last."""
    after = [s for s in samples if s["episodes"] >= warmup]
    if len(after) < 2 or after[-1]["episodes"] == after[0]["episodes"]:
        return dict.fromkeys(CPU_KINDS)

    def cpu(s: dict[str, Any], kind: str) -> float:
        return s["engine_cpu_s"] if kind == "engine" else s["workers_cpu_s"][kind]

    a, b = after[0], after[-1]
    n = b["episodes"] - a["episodes"]
    return {k: round(1000 * (cpu(b, k) - cpu(a, k)) / n, 1) for k in CPU_KINDS}


def steps_rate(samples: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(time, steps/s over the interval ending then) for every sample after the first."""
    return [(b["t"], (b["steps"] - a["steps"]) / (b["t"] - a["t"])) for a, b in zip(samples, samples[1:], strict=False)
            if b["t"] > a["t"]]


def count_log(log: Path) -> dict[str, int]:
    """Recycles and discards the workers wrote to the run's log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return {name: len(pattern.findall(text)) for name, pattern in LOG_COUNTS.items()}


def browser_changes(samples: list[dict[str, Any]]) -> int:
    """How often a worker's browser pid changed between samples (a recycle or a crash seen by the sampler)."""
    last: dict[str, int] = {}
    changes = 0
    for s in samples:
        for w in s["workers"]:
            prev = last.get(w["worker_id"])
            if prev and w["browser_pid"] and w["browser_pid"] != prev:
                changes += 1
            if w["browser_pid"]:
                last[w["worker_id"]] = w["browser_pid"]
    return changes


def sampled_kinds(null_workers: bool) -> tuple[str, ...]:
    """The process kinds a run samples: null workers have no worker process, driver or browser of their own."""
    return ("engine", "sites") if null_workers else proc_stats.KINDS


def plot(path: Path, samples: list[dict[str, Any]], warmup: int, figures: dict[str, dict[str, Any]],
         kinds: tuple[str, ...] = proc_stats.KINDS) -> Path:
    """Memory over episodes, one panel per process kind in ``kinds`` (with its fitted slope), and steps/s over
    time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 1 if len(kinds) < 3 else 2
    fig, axes = plt.subplots(rows, 3, figsize=(13, 3.4 * rows), dpi=100)
    xs = [s["episodes"] for s in samples]
    for ax, kind in zip(axes.flat, kinds, strict=False):
        ax.plot(xs, [s["kinds"][kind] for s in samples], lw=1.2)
        ax.axvline(warmup, color="grey", ls="--", lw=0.8)
        fit = figures[kind]["slope_mib_per_1k"]
        ax.set_title(f"{KIND_LABELS[kind]}\nslope {fit:+.2f} MiB / 1k episodes" if fit is not None
                     else KIND_LABELS[kind], fontsize=9)
        ax.set_xlabel("episodes done", fontsize=8)
        ax.set_ylabel("MiB", fontsize=8)
        ax.tick_params(labelsize=7)
    ax = axes.flat[len(kinds)]
    rate = steps_rate(samples)
    ax.plot([t for t, _ in rate], [r for _, r in rate], lw=1.0, color="tab:green")
    ax.set_title("steps/s (per sample interval)", fontsize=9)
    ax.set_xlabel("seconds", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.suptitle(f"Soak: {samples[-1]['episodes']:,} episodes (dashed: end of warm-up, {warmup:,} episodes)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def progress_printer(core: EngineCore, total: int, every_s: float = 30.0) -> Any:
    """A record hook that prints the progress at most every ``every_s`` seconds."""
    last = time.monotonic()

    def hook(_rollout: Any, _record: dict[str, Any]) -> None:
        nonlocal last
        if time.monotonic() - last >= every_s:
            last = time.monotonic()
            s = core.stats
            print(f"  {time.strftime('%H:%M:%S')} {s.done:,}/{total:,} episodes, {s.steps_per_s:.1f} steps/s, errors "
                  f"{s.outcomes['error']}", flush=True)

    return hook


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak; returns everything the result file holds."""
    warmup = args.warmup if args.warmup is not None else args.episodes // 10
    with (tempfile.TemporaryDirectory(prefix="soak-", dir=args.run_root) as tmp, SiteServer() as sites,
          contextlib.ExitStack() as stack):
        tasks_file = soak_tasks(Path(tmp) / "tasks.jsonl", args.keep_task_caps)
        # --null-workers: the engine alone, its workers benchmark stand-ins with no browser (bench/null_worker.py).
        endpoint = f"ipc://{tmp}/engine.sock"
        workers = {"listen": endpoint, "spawn_workers": False} if args.null_workers else {}
        cfg = RunConfig(tasks=str(tasks_file), concurrency=args.concurrency, workers=args.workers,
                        episodes=args.episodes, step_caps=args.step_caps, output_dir=str(Path(tmp) / "runs"),
                        **workers)  # type: ignore[arg-type]
        if args.null_workers:
            stack.enter_context(null_workers(endpoint, args.workers, slots=args.concurrency + 64))
        plan = plan_episodes(load_tasks(tasks_file, sites.base_url), args.episodes, set())
        planned = [episode_key(t.task_id, s) for t, s in plan]
        core = EngineCore(cfg, base_url=sites.base_url)
        # An episode has entered the engine once it reports a status. An interrupted run is audited against those
        # alone (the plan's unstarted tail is not missing), a complete one against the whole plan. Only the
        # episodes in flight are kept, so that the harness adds nothing per episode to the engine's memory.
        in_flight: set[str] = set()
        entered = 0

        def on_status(st: EpisodeStatus) -> None:
            nonlocal entered
            if not st.ended and st.episode_id not in in_flight:
                in_flight.add(st.episode_id)
                entered += 1

        core.on_status(on_status)
        core.on_record(lambda rollout, _rec: in_flight.discard(rollout.episode_id))
        sampler = Sampler(core, args.sample_s, Path(tmp) / "samples.jsonl")
        core.on_record(progress_printer(core, args.episodes))
        trace = GrowthTrace()

        def trace_after_warmup(_rollout: Any, _record: EpisodeRecord) -> None:
            if not trace.started and core.stats.done >= warmup:
                trace.start(core.stats.done)

        if args.trace_growth:
            core.on_record(trace_after_warmup)
        # SIGTERM (or Ctrl-C) stops the run early; what was sampled until then is still written, marked interrupted.
        me = asyncio.current_task()
        assert me is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
        interrupted = False
        try:
            await core.start({"benchmark": "soak", "policy": args.policy})
            sampler.start()
            await core.run_plan(make_policy(args.policy), plan)
        except asyncio.CancelledError:
            me.uncancel()
            interrupted = True
            print("interrupted: writing what was sampled so far", flush=True)
        finally:
            await sampler.stop()  # the last sample while the workers still run
            growth = trace.top(core.stats.done, args.trace_growth)  # before close: what the run itself holds
            await core.close()
        stats, run_dir = core.stats, core.run_dir
        assert run_dir is not None
        samples = sampler.samples
        if interrupted:  # the episodes the engine never ended (its runners go on until close cancels them) were cut
            started = sorted(recorded_ids(run_dir) | in_flight)
            audit = audit_records(run_dir, started, cut=in_flight)
            audit["exactly_one_each"] = audit["exactly_one_each"] and len(started) == entered
        else:
            audit = audit_records(run_dir, planned)
        audit["entered"] = entered
        audit["planned"] = len(planned)
        logs = count_log(run_dir / "workers.log")
    figures = series_figures(samples, warmup, args.workers)
    return {"samples": samples, "figures": figures, "cpu_per_episode": cpu_per_episode(samples, warmup),
            "audit": audit, "logs": logs, "warmup": warmup, "growth": growth,
            "stats": stats.summary(), "browser_pid_changes": browser_changes(samples), "interrupted": interrupted}


def summary_rows(res: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The headline figures with their goals."""
    audit, stats, figs = res["audit"], res["stats"], res["figures"]
    rows = [row("episodes", audit["started"], "episodes"),
            row("duration (from the first episode)", stats["elapsed_s"] / 60, "min"),
            row("steps/s", stats["steps_per_s"], "steps/s"),
            row("episodes/s", audit["records"] / stats["elapsed_s"] if stats["elapsed_s"] else 0.0, "episodes/s"),
            *(row(f"CPU per episode: {CPU_LABELS[k]}", res["cpu_per_episode"][k] or 0.0, "ms") for k in CPU_KINDS
              if k == "engine" or not args.null_workers),
            row("records written", audit["records"], "records",
                f"= episodes started ({audit['started']:,}) less those cut in flight ({audit['cut_without_record']})",
                audit["records"] == audit["started"] - audit["cut_without_record"]),
            row("episodes without exactly one record", audit["missing"] + audit["duplicated"] + audit["unexpected"],
                "episodes", "0", audit["exactly_one_each"]),
            row("error records", audit["statuses"].get("error", 0), "records", "0",
                audit["statuses"].get("error", 0) == 0),
            row("worker restarts", stats["worker_restarts"], "restarts", "0", stats["worker_restarts"] == 0)]
    for kind in sampled_kinds(args.null_workers):
        f = figs[kind]
        goal = SLOPE_GOALS[kind] * f["per_process"]
        per = f" ({f['per_process']} workers)" if kind in PER_WORKER else ""
        rows.append(row(f"{KIND_LABELS[kind]}{per} after warm-up", f["after_warmup_mib"], "MiB"))
        rows.append(row(f"{KIND_LABELS[kind]}{per} at the end", f["end_mib"], "MiB"))
        fit = f["slope_mib_per_1k"]
        traced = bool(args.trace_growth)  # a traced run's memory includes the tracer's: no goal is judged
        rows.append(row(f"{KIND_LABELS[kind]}{per} slope after warm-up", fit if fit is not None else float("nan"),
                        "MiB per 1,000 episodes", None if traced else f"<= {goal:g}",
                        None if traced or fit is None else fit <= goal))
    rss = figs["engine_rss"]["slope_mib_per_1k"]
    rows.append(row("engine process (RSS) slope after warm-up", rss if rss is not None else float("nan"),
                    "MiB per 1,000 episodes"))
    rows.append(row("browser recycles (memory cap)", res["logs"]["browser_recycles"], "recycles"))
    rows.append(row("contexts discarded for their heap", res["logs"]["contexts_over_memory"], "contexts"))
    return rows


def notes(res: dict[str, Any], args: argparse.Namespace) -> list[str]:
    audit = res["audit"]
    out = [f"{args.episodes:,} episodes of the {args.policy} policy on the bundled tasks, step caps "
           f"{','.join(map(str, args.step_caps))}{'' if args.keep_task_caps else ' for every task'}, concurrency "
           f"{args.concurrency}, {args.workers} workers; memory sampled every {args.sample_s:g} s "
           f"({len(res['samples'])} samples); slopes fitted after the first {res['warmup']:,} episodes.",
           "Goals: the engine at most 1 MiB per 1,000 episodes (1 GiB over a million-episode training run; anything "
           "kept per episode by mistake, a record of a few KiB or a frame of ~100 KiB, shows far above it); each "
           "worker and driver process 1 MiB per 1,000 episodes; each Chromium 5 MiB per 1,000 episodes (renderers "
           "come and go with contexts, and the worker's memory cap recycles a browser anyway).",
           "Contexts recycled at the reuse cap (WorkerConfig.context_reuse, 50 episodes) are not logged by the "
           f"workers: about {args.episodes // 50:,} over this run.",
           f"Outcomes: {audit['statuses']}; error kinds: {audit['error_kinds'] or 'none'}."]
    if args.null_workers:
        out.insert(0, "The engine alone: its workers were null workers (bench/null_worker.py, benchmark stand-ins that "
                      "answer every request at once with a pre-encoded screenshot, no browser), so only the engine "
                      "process and the site server are sampled.")
    if args.trace_growth:
        out.insert(0, "Traced (--trace-growth): tracemalloc ran from the end of the warm-up, so the engine's memory "
                      "figures include the tracer's own (tens of bytes per live block) and its CPU figures the cost of "
                      "tracing; `growth` lists the source lines whose live allocations grew most.")
    if res["interrupted"]:
        out.insert(0, f"INTERRUPTED after {audit['started']:,} of {audit['planned']:,} planned episodes had started "
                      f"({audit['cut_without_record']:,} of them cut in flight, with no record so that a resumed run "
                      "reruns them; every other one checked for exactly one record): the figures cover only that part "
                      "of the run.")
    if res["growth"]:
        out.append("Live allocations grown after the warm-up, by source line (tracemalloc; bytes per episode, live "
                   "blocks): " + "; ".join(f"{g['where']} {g['bytes_per_episode']:g} B ({g['blocks']:,})"
                                           for g in res["growth"]) + ".")
    cpu = res["cpu_per_episode"]
    if cpu["browser"]:
        total, cores = sum(v or 0.0 for v in cpu.values()), os.cpu_count() or 1
        out.append(f"CPU per episode after warm-up: {total:.0f} ms in all ({cpu['browser']:.0f} ms of it Chromium's: "
                   "the page load, two screenshots and the context's reset); at that cost this machine's "
                   f"{cores} cores run at most {1000 * cores / total:.1f} episodes/s.")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The soak's command line (its defaults are the stored run's)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--policy", default="instant", choices=["instant", "scripted"])
    ap.add_argument("--step-caps", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 1, 1),
                    help="steps per difficulty bucket E,M,H (default 1,1,1)")
    ap.add_argument("--keep-task-caps", action="store_true", help="keep the tasks' own max_steps (longer episodes)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--warmup", type=int, default=None, help="episodes before the slopes are fitted (default: 10%%)")
    ap.add_argument("--run-root", default=None, help="where the run directory goes (removed at the end)")
    ap.add_argument("--null-workers", action="store_true",
                    help="the engine alone: null workers (benchmark stand-ins, no browser) instead of Chromium")
    ap.add_argument("--trace-growth", type=int, default=0, metavar="N",
                    help="trace allocations after the warm-up (tracemalloc) and report the N source lines that grew "
                         "most; its memory figures then include the tracer's own")
    ap.add_argument("--name", default="soak", help="the result's file names (NAME.json, NAME.png)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="directory of NAME.json and NAME.png")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import uvloop

    tune_for_engine_process()  # as webgym-engine run does
    res = uvloop.run(soak(args))
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(args.out / f"{args.name}.png", res["samples"], res["warmup"], res["figures"],
               sampled_kinds(args.null_workers))
    rows = summary_rows(res, args)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    write_result(args.out / f"{args.name}.json", "soak", config, rows, [png.name], notes(res, args),
                 figures=res["figures"], audit=res["audit"], worker_log=res["logs"], stats=res["stats"],
                 browser_pid_changes=res["browser_pid_changes"], interrupted=res["interrupted"],
                 growth=res["growth"], samples=res["samples"])
    for r in rows:
        met = "" if r["met"] is None else ("  met" if r["met"] else "  MISSED")
        print(f"{r['figure']:60s} {r['value']:>12,.3f} {r['unit']}{met}")
    if res["growth"]:
        print("\nlive allocations grown since the warm-up, by source line (tracemalloc):")
    for g in res["growth"]:
        print(f"  {g['bytes_per_episode']:>10,.1f} B/episode  {g['blocks']:>9,} blocks  {g['where']}")
    return 0 if res["audit"]["exactly_one_each"] and not res["interrupted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
