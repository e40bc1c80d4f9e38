"""The ``overhead`` suite: The engine process's CPU per step by phase: a run with the simulated policy (fast, Set-of-
Marks, so prompt building and parsing run) is timed without a profiler, then profiled with cProfile over a second
window; each function's own time is mapped to a phase by its module (messaging: browserpool.pool, zmq, msgpack;
image path: engine._imgcodec, shared-memory frames; prompt building: engine.agent's context and prompts, the agent
policy; parsing: engine.agent.parser, coords, actions; store writes: engine.store.run_dir;
telemetry: engine.telemetry.publisher; scheduling: rollout, runner, stats; policy backend: the simulated model; library
and builtin functions go to the phase of the project code that called them, the rest to "event loop and other"), and
the phases' shares are applied to the unprofiled CPU per step (cProfile inflates Python time); the screenshot writer
thread's CPU is read from its own clock, and the rest of the process's threads make "other threads". Then
``bench/monitor.py``'s engine run: steps/s with a monitor process attached and without (telemetry on, nobody
listening), alternating; goal: at most 3% fewer.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.proc_stats import named_thread_cpu_s
from bench.suite import SuiteResult, plot_series
from bench.suites.common import engine_run_s, write_task_mix
from engine.store.frame_writer import THREAD_NAME as WRITER_THREAD

CONFIG: dict[str, dict[str, Any]] = {  # per scale (the CLI's --repeats overrides "repeats")
    "full": {"concurrency": 32, "warmup": 10.0, "seconds": 30.0, "sim_speed": 50.0, "monitor_concurrency": 32,
             "monitor_seconds": 15.0, "repeats": 3},
    "quick": {"concurrency": 16, "warmup": 5.0, "seconds": 8.0, "sim_speed": 50.0, "monitor_concurrency": 16,
              "monitor_seconds": 6.0, "repeats": 1},
    "tiny": {"concurrency": 2, "warmup": 1.0, "seconds": 1.5, "sim_speed": 50.0, "monitor_concurrency": 2,
             "monitor_seconds": 1.0, "repeats": 1, "workers": 1, "monitor_settle_s": 0.5},
}


def budget_s(cfg: dict[str, Any]) -> float:
    """What a run of ``cfg`` takes at most (bench.suites.common's time model): per repeat an engine run with its
    warm-up, an unprofiled window, half a window under py-spy and a profiled window; then the monitor's run of
    alternating windows (each after its settle time) and the monitor's own start."""
    window = cfg["seconds"]
    profiled = engine_run_s("light", cfg["concurrency"], cfg["warmup"] + 2.5 * window)
    monitor = engine_run_s("light", cfg["monitor_concurrency"], cfg["repeats"] * 2 * (
        cfg["monitor_seconds"] + cfg.get("monitor_settle_s", 3.0))) + MONITOR_START_S
    return cfg["repeats"] * profiled + monitor


PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("messaging", ("browserpool/pool.py", "browserpool/routing.py", "browserpool/session.py", "browserpool/trust.py",
                   "browserpool/supervisor.py", "browserpool/worker_handle.py", "browserpool/protocol.py", "/zmq/",
                   "msgpack")),
    ("image path", ("_imgcodec", "browserpool/shm.py")),
    ("prompt building", ("engine/agent/context.py", "engine/agent/prompts.py", "policy/agent_policy.py",
                         "policy/model.py", "policy/vision.py", "policy/base.py")),
    ("parsing", ("engine/agent/parser.py", "engine/agent/coords.py", "engine/agent/actions.py")),
    ("store writes", ("engine/store/run_dir.py",)),
    ("telemetry", ("engine/telemetry/publisher.py", "cli/progress.py")),
    ("policy backend", ("policy/simulated.py", "policy/instant.py")),
    ("scheduling", ("engine/episode/rollout.py", "engine/clients/runner.py", "engine/store/stats.py",
                    "engine/rewards/programmatic.py", "engine/rewards/judge_queue.py")),
]
#: Allowed for the monitor benchmark's own start (its Textual app, the engine's telemetry socket) before its windows:
#: not timed apart (the whole quick suite took 63-69 s in the runs of 2026-12-04).
MONITOR_START_S = 5.0
OTHER = "event loop and other"
WRITER = "screenshot writer thread"  # engine/store/frame_writer.py: the files' system calls, off the loop
OTHER_THREADS = "other threads"  # the engine process's other threads: ZeroMQ's I/O, the default executor
PHASE_NAMES = [p for p, _ in PHASES] + [OTHER, WRITER, OTHER_THREADS]


def _direct_phase(func: tuple[str, int, str]) -> str | None:
    """The phase of a profiled function by its file (or, for builtins, its qualified name); None: by caller."""
    filename, _, name = func
    where = filename.replace(os.sep, "/") if filename != "~" else name
    for phase, markers in PHASES:
        if any(m in where for m in markers):
            return phase
    return None


def phase_times(stats: pstats.Stats) -> dict[str, float]:
    """Own CPU time (s) per phase: project functions by module; library functions and builtins by their callers'
    phases (split by the time spent under each caller), recursively; what no project code called: OTHER."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    memo: dict[Any, dict[str, float]] = {}

    def shares(func: Any, depth: int, seen: frozenset[Any]) -> dict[str, float]:
        if func in memo:
            return memo[func]
        phase = _direct_phase(func)
        if phase is not None:
            out = {phase: 1.0}
        else:
            callers = raw.get(func, (0, 0, 0.0, 0.0, {}))[4]
            weights = {c: v[2] + v[3] for c, v in callers.items() if c not in seen}
            total = sum(weights.values())
            if depth > 8 or not total:
                out = {OTHER: 1.0}
            else:
                out = {}
                for caller, w in weights.items():
                    for p, s in shares(caller, depth + 1, seen | {func}).items():
                        out[p] = out.get(p, 0.0) + s * w / total
        if depth == 0 or phase is not None:
            memo[func] = out
        return out

    times = {p: 0.0 for p in PHASE_NAMES if p not in (WRITER, OTHER_THREADS)}
    for func, (_, _, tt, _, _) in raw.items():
        for p, s in shares(func, 0, frozenset()).items():
            times[p] += tt * s
    return times


async def profiled_run(base: str, n: int, warmup: float, seconds: float, workers: int, sim_speed: float,
                       out_dir: Path, pyspy_path: Path | None = None) -> dict[str, Any]:
    """The engine with the (fast) simulated policy: CPU per step unprofiled, then (with ``pyspy_path``) a py-spy
    sample of the process into that file over half a window, then per phase under cProfile."""
    from engine.agent.prompts import AgentConfig
    from engine.clients.runner import run
    from engine.core.config import RunConfig
    from policy.registry import BackendConfig, make_policy

    agent = AgentConfig(interaction="som")
    backend = BackendConfig(sim_speed=sim_speed)
    tasks_file = out_dir / "tasks.jsonl"
    write_task_mix(tasks_file, 8, seed=0)
    cfg = RunConfig(tasks=str(tasks_file), concurrency=n, workers=workers,
                    output_dir=str(out_dir / "runs"), episodes=n * 1000)
    policy = make_policy("simulated", agent=agent, backend=backend)
    started: dict[str, Any] = {}
    stepping: set[str] = set()

    def on_status(st: Any) -> None:
        if st.step >= 1 or st.state.value in ("F", "X"):
            stepping.add(st.episode_id)

    task = asyncio.ensure_future(run(cfg, policy, base, on_start=lambda e, d: started.update(engine=e),
                                     on_status=on_status))
    while "engine" not in started and not task.done():
        await asyncio.sleep(0.05)
    if task.done():
        task.result()
    stats = started["engine"].stats
    ramp0 = time.monotonic()
    # Measure once every rollout is past its first page load (a slow machine takes a while to get there).
    while len(stepping) < n and time.monotonic() - ramp0 < 120 and not task.done():
        await asyncio.sleep(0.1)
    await asyncio.sleep(warmup)
    t0, s0, c0, th0 = time.monotonic(), stats.steps, time.process_time(), time.thread_time()
    w0 = named_thread_cpu_s(WRITER_THREAD)
    await asyncio.sleep(seconds)
    t1, s1, c1, th1 = time.monotonic(), stats.steps, time.process_time(), time.thread_time()
    w1 = named_thread_cpu_s(WRITER_THREAD)
    # CPU time of the event loop's thread, not wall time: on a busy machine wall time also counts the moments
    # the process waits for a core.
    pyspy = await pyspy_window(seconds / 2, pyspy_path) if pyspy_path is not None else None
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    p0, ps0 = stats.steps, time.process_time()
    await asyncio.sleep(seconds)
    prof.disable()
    p1, ps1 = stats.steps, time.process_time()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    times = phase_times(pstats.Stats(prof))
    total = sum(times.values()) or 1.0
    steps = max(1, s1 - s0)
    cpu_per_step = (c1 - c0) * 1000 / steps
    loop_per_step = min(cpu_per_step, (th1 - th0) * 1000 / steps)  # the event loop's thread: what cProfile sees
    phase_ms = {p: loop_per_step * t / total for p, t in times.items()}
    phase_ms[WRITER] = min(cpu_per_step - loop_per_step, (w1 - w0) * 1000 / steps)
    phase_ms[OTHER_THREADS] = cpu_per_step - loop_per_step - phase_ms[WRITER]
    top = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:15]  # type: ignore[attr-defined]
    return {"concurrency": n, "steps_per_s": round((s1 - s0) / (t1 - t0), 2),
            "cpu_ms_per_step": round(cpu_per_step, 3),
            "profiled_cpu_ms_per_step": round((ps1 - ps0) * 1000 / max(1, p1 - p0), 3),
            "loop_thread_cpu_ms_per_step": round(loop_per_step, 3),
            "phase_share_of_loop_thread": {p: round(t / total, 4) for p, t in times.items()},
            "phase_ms_per_step": {p: round(ms, 4) for p, ms in phase_ms.items()},
            "top_functions": [{"function": f"{f[0]}:{f[1]}({f[2]})", "own_s": round(v[2], 4), "calls": v[1]}
                              for f, v in top],
            "pyspy": pyspy}


async def pyspy_window(seconds: float, path: Path) -> dict[str, Any] | None:
    """Sample this (the engine's) process with py-spy for ``seconds``, without pausing it, into ``path`` (collapsed
    stacks); returns the functions with the most samples on top of the stack. None when py-spy is not installed
    or may not attach (it needs ptrace rights over the process)."""
    exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
        return None
    proc = await asyncio.create_subprocess_exec(
        exe, "record", "--pid", str(os.getpid()), "--duration", str(max(1, round(seconds))), "--rate", "100",
        "--nonblocking", "--format", "raw", "--output", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0 or not path.exists():
        return {"error": err.decode(errors="replace").strip().splitlines()[-1:] or "py-spy failed"}
    return collapsed_top(path.read_text())


def collapsed_top(text: str, n: int = 15) -> dict[str, Any]:
    """Leaf functions with the most samples in py-spy's collapsed stacks (``frame;frame;leaf count`` lines), with
    their share of all samples (py-spy leaves out the samples of a waiting thread: these are CPU samples)."""
    own: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            leaf = stack.rsplit(";", 1)[-1]
            own[leaf] = own.get(leaf, 0) + int(count)
    total = sum(own.values())
    top = sorted(((c, f) for f, c in own.items()), reverse=True)[:n]
    return {"samples": total,
            "top_own": [{"function": f, "samples": c, "share": round(c / max(1, total), 4)} for c, f in top]}


async def monitor_windows(n: int, workers: int, seconds: float, repeats: int,
                          settle_s: float = 3.0) -> list[tuple[float, float]]:
    """Steps/s without and with an attached monitor, one pair per repeat: ``bench/monitor.py``'s alternating
    windows of one run (that module measures the monitor; this suite reports the same figure). Raises
    RuntimeError when a window pair is missing."""
    from bench import monitor

    # A monitor that never subscribes must not hang the suite.
    limit = 180.0 + repeats * 2 * (seconds + 10.0)
    got = await asyncio.wait_for(monitor.engine_overhead(n, workers, seconds, repeats, settle_s), limit)
    windows = got["windows"]
    pairs: list[tuple[float, float]] = []
    for i in range(0, len(windows) - 1, 2):
        side = {bool(w["monitor"]): float(w["steps_per_s"]) for w in windows[i:i + 2]}
        if len(side) == 2:
            pairs.append((side[False], side[True]))
    if len(pairs) != repeats:
        raise RuntimeError(f"the monitor benchmark gave {len(pairs)} window pairs of {repeats}: {windows}")
    return pairs


async def measure(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """Engine CPU per step by phase (cProfile shares of the unprofiled CPU time); monitor attached vs not."""
    for rep in range(cfg["repeats"]):
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
            row = await profiled_run(base, cfg["concurrency"], cfg["warmup"], cfg["seconds"], cfg["workers"],
                                     cfg["sim_speed"], Path(tmp), pyspy_path=out / f"engine-pyspy-{rep}.txt")
        res.add("cpu_ms_per_step", f"c{cfg['concurrency']}: engine CPU per step (simulated policy, SoM)",
                row["cpu_ms_per_step"], "ms", ("<=", 2.0))
        res.add("steps_per_s", f"c{cfg['concurrency']}: steps/s (profile run)", row["steps_per_s"], "steps/s")
        for phase, ms in row["phase_ms_per_step"].items():
            res.add(f"phase.{phase.replace(' ', '_')}", f"CPU per step: {phase}", ms, "ms")
        res.runs.append({"repeat": rep, "kind": "profile", **row})
        print(f"  overhead: {row['cpu_ms_per_step']:.2f} ms CPU per step at {row['steps_per_s']:.1f} steps/s: "
              + ", ".join(f"{p} {ms:.3f}" for p, ms in row["phase_ms_per_step"].items()), flush=True)
    n, secs = cfg["monitor_concurrency"], cfg["monitor_seconds"]
    pairs = await monitor_windows(n, cfg["workers"], secs, cfg["repeats"], cfg.get("monitor_settle_s", 3.0))
    for rep, (without, with_) in enumerate(pairs):
        res.add("monitor.without_steps_per_s", f"c{n}: steps/s, no monitor attached", without, "steps/s")
        res.add("monitor.with_steps_per_s", f"c{n}: steps/s, monitor attached", with_, "steps/s")
        res.add("monitor.slowdown_pct", f"c{n}: steps/s lost to an attached monitor",
                100 * (1 - with_ / without) if without else None, "%", ("<=", 3.0))
        res.runs.append({"repeat": rep, "kind": "monitor", "without_steps_per_s": without,
                         "with_steps_per_s": with_})
        print(f"  overhead: monitor off {without:.1f} steps/s, on {with_:.1f} steps/s", flush=True)
    phases = PHASE_NAMES
    plot_series(out / "overhead.png", "Engine CPU per step by phase", "phase", "ms per step",
                {"CPU": (phases, [res.figures.get(f"phase.{p.replace(' ', '_')}") for p in phases])},
                logx=False, kind="bar")
    res.plots.append("overhead.png")
    res.notes.append("Phases: cProfile (thread CPU time; each function's own time, library and builtin calls charged "
                     "to the project code that made them) gives the shares of the event loop thread's CPU, applied to "
                     "that thread's CPU per step measured without the profiler; the screenshot writer thread's CPU "
                     "(the files' system calls; the run directory is under the system's temp dir) is read from "
                     "its own clock; 'other threads' is the rest of the process's CPU time (ZeroMQ's I/O thread).")
