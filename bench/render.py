"""Markdown from stored benchmark results: the suites' tables, the standalone benchmarks' sections, and the page
``docs/benchmarks.md`` made of them.

Everything here is a pure function of the parsed JSON files (a :data:`Store`: file stem -> data), so that the
same stored results always render to the same text. Two kinds of file:

- a suite's result (``webgym-engine bench``: ``suite``, ``figures``, ``machine``, ...), rendered as a table of
  its figures (median [min-max], goal, met), its notes and plots;
- a standalone benchmark's (``python -m bench.NAME --json ...``). The convention for new ones is a top-level
  ``summary`` list of rows ``{"figure", "value", "unit", "goal", "met"}`` with optional ``plots`` and ``notes``
  lists, rendered by :func:`summary_section` with no code of its own. The older files without a ``summary`` each
  have a small renderer in :data:`STANDALONE`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench.suite import SUITE_NAMES, num_text, range_text

Store = dict[str, dict[str, Any]]  # file stem in docs/benchmarks/ -> its parsed JSON
# Machine facts that differ between suites of one run without saying anything about the machine.
_MOMENT_FACTS = ("load_average", "memory_available_gib", "hostname")


class FigureError(Exception):
    """A figure a page cites is not in the stored results (a missing file, figure or field)."""


# --- access to the stored results ----------------------------------------------------------------------------
def need(store: Store, name: str) -> dict[str, Any]:
    """The stored file ``name`` (a stem in docs/benchmarks/), or a :class:`FigureError` naming it."""
    if name not in store:
        raise FigureError(f"docs/benchmarks/{name}.json is not stored")
    return store[name]


def field(data: dict[str, Any], *path: str | int, source: str = "") -> Any:
    """``data[path[0]][path[1]]...``, or a :class:`FigureError` naming the file and the path."""
    cur: Any = data
    for key in path:
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            where = f"docs/benchmarks/{source}.json" if source else "the stored result"
            raise FigureError(f"{where} has no {'.'.join(map(str, path))}") from None
    return cur


def figure(data: dict[str, Any], key: str) -> dict[str, Any]:
    """The figure ``key`` of a suite's result."""
    return field(data, "figures", key, source=data.get("suite", ""))


def value_text(fig: dict[str, Any]) -> str:
    """A stored figure as ``median [min-max] unit``."""
    return range_text(fig.get("median"), fig.get("min"), fig.get("max"), fig.get("n") or 0, fig.get("unit") or "")


def met_text(met: bool | None) -> str:
    """``yes``, a bold ``no``, or nothing for a figure without a goal."""
    return "" if met is None else ("yes" if met else "**no**")


def pct(share: float) -> str:
    """A share (0-1) as a whole percentage."""
    return f"{share * 100:.0f}%"


def span(values: Sequence[float], unit: str = "") -> str:
    """The lowest and highest of some values as ``a-b unit`` (one value when they read alike)."""
    lo, hi = num_text(min(values)), num_text(max(values))
    return (lo if lo == hi else f"{lo}-{hi}") + (f" {unit}" if unit else "")


def pct_range(shares: Sequence[float]) -> str:
    """The lowest and highest of some shares (0-1) as ``a-b%`` (one value when they round alike)."""
    lo, hi = pct(min(shares)), pct(max(shares))
    return lo if lo == hi else f"{lo[:-1]}-{hi}"


def stored(v: float) -> str:
    """A value the benchmark stored already rounded, as it stored it (``-0.48``, ``73.7``)."""
    return f"{v:g}"


def plural(n: int, word: str) -> str:
    """``1 repeat``, ``2 repeats``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def is_suite(data: dict[str, Any]) -> bool:
    """Whether a stored file is a suite's result (``webgym-engine bench``)."""
    return "suite" in data and "figures" in data


def summary_of(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The ``summary`` rows of a file that follows the convention, else None (an older ``summary`` dict is not)."""
    rows = data.get("summary")
    if isinstance(rows, list) and all(isinstance(r, dict) and "figure" in r for r in rows):
        return rows
    return None


def summary_value(row: dict[str, Any]) -> str:
    """One ``summary`` row's value with its unit."""
    unit, value = row.get("unit") or "", num_text(row.get("value"))
    return value if value == "n/a" or not unit else f"{value} {unit}"


# --- suites --------------------------------------------------------------------------------------------------
def machine_lines(machine: dict[str, Any]) -> list[str]:
    """The machine facts a suite's result records, as a list."""
    libs = ", ".join(f"{k} {v}" for k, v in (machine.get("libraries") or {}).items() if v)
    gpu = machine.get("gpu")
    return [
        f"- Machine: {machine.get('cores')} cores ({machine.get('cpu_model') or 'unknown CPU'}), "
        f"{machine.get('memory_gib')} GiB memory ({machine.get('memory_available_gib')} GiB available at the start), "
        f"load average at the start {machine.get('load_average')}",
        f"- GPU: {gpu['name'] + ' x' + str(gpu['count']) if gpu else 'none'}",
        f"- {machine.get('chromium') or 'Chromium: unknown'}; Python {machine.get('python')}; {machine.get('os')}",
        f"- Libraries: {libs}",
        f"- Code: {machine.get('git_revision') or 'unknown revision'}",
    ]


def machine_groups(suites: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """The suites' results grouped by the machine and code they were measured on: (machine, suite names)."""
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for s in suites:
        m = s.get("machine") or {}
        key = repr({k: v for k, v in m.items() if k not in _MOMENT_FACTS})
        groups.setdefault(key, (m, []))[1].append(s["suite"])
    return list(groups.values())


def goal_rows(suites: Sequence[dict[str, Any]], others: Store | None = None) -> list[list[str]]:
    """Every figure with a goal: the suites' and the ``summary`` rows of the standalone benchmarks."""
    rows = [[s["suite"], f["label"], value_text(f), f["goal"], met_text(f["met"])]
            for s in suites for f in s["figures"].values() if f.get("goal")]
    for name, data in sorted((others or {}).items()):
        rows += [[name, r["figure"], summary_value(r), r["goal"], met_text(r.get("met"))]
                 for r in summary_of(data) or [] if r.get("goal")]
    return rows


def suite_section(data: dict[str, Any], plots_prefix: str = "", with_machine: bool = False) -> list[str]:
    """One suite's section: how it ran, its figures, notes and plots (or why it was skipped)."""
    lines = [f"## {data['suite']}", ""]
    started = (data.get("started_at") or "").replace("T", " ").replace("+00:00", " UTC")
    took = data.get("duration_s") or 0
    took_text = "" if data.get("skipped") else f", {round(took)} s" if took < 90 else f", {round(took / 60)} min"
    lines += [f"Scale `{data.get('scale')}`, {plural(data.get('repeats') or 0, 'repeat')}, started "
              f"{started or 'at an unknown time'}{took_text}.", ""]
    if with_machine:
        lines += [*machine_lines(data.get("machine") or {}), ""]
    if data.get("skipped"):
        return [*lines, f"Skipped: {data['skipped']}", ""]
    lines += table(("figure", "value", "goal", "met"),
                   ((f["label"], value_text(f), f.get("goal") or "", met_text(f.get("met")))
                    for f in data["figures"].values()))
    lines.append("")
    rows = summary_of(data)
    if rows:
        lines += [*summary_table(rows), ""]
    return lines + notes_and_plots(data, plots_prefix)


def notes_and_plots(data: dict[str, Any], plots_prefix: str) -> list[str]:
    """A stored result's notes as a list, then its plots (file names in the same directory)."""
    lines = [f"- {n}" for n in data.get("notes") or []]
    if lines:
        lines.append("")
    plots = []
    for p in data.get("plots") or []:
        path = p if isinstance(p, str) else p.get("path") or p.get("file")
        title = path if isinstance(p, str) else p.get("title") or path
        plots.append(f"![{title}]({plots_prefix}{path})")
    return lines + plots + ([""] if plots else [])


def suites_markdown(suites: Sequence[dict[str, Any]], plots_prefix: str = "", others: Store | None = None) -> list[str]:
    """The machine (once, when all suites share it), the goals table, then one section per suite."""
    shared = len(machine_groups(suites)) <= 1
    lines: list[str] = []
    if shared and suites:
        lines += [*machine_lines(suites[0].get("machine") or {}), ""]
    goals = goal_rows(suites, others)
    if goals:
        lines += ["## Goals", "", *table(("benchmark", "figure", "value", "goal", "met"), goals), ""]
    for s in suites:
        lines += suite_section(s, plots_prefix, with_machine=not shared)
    return lines


def results_summary(suites: Sequence[dict[str, Any]]) -> str:
    """A results directory's ``summary.md``: the run's suites alone."""
    head = ["# Benchmark summary", "",
            "Each value is the median over the repeats, with [min-max]. Produced by `webgym-engine bench`.", ""]
    return "\n".join(head + suites_markdown(suites)).rstrip() + "\n"


# --- standalone benchmarks -----------------------------------------------------------------------------------
def summary_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The ``summary`` rows as a table."""
    return table(("figure", "value", "goal", "met"),
                 ((r["figure"], summary_value(r), r.get("goal") or "", met_text(r.get("met"))) for r in rows))


def summary_section(data: dict[str, Any], plots_prefix: str) -> list[str]:
    """A file that follows the ``summary`` convention: the machine it records, its rows, notes and plots."""
    machine = data.get("machine")
    head = [*machine_lines(machine), ""] if isinstance(machine, dict) and "chromium" in machine else []
    return [*head, *summary_table(summary_of(data) or []), "", *notes_and_plots(data, plots_prefix)]


POLICY_NAMES = {"instant": "instant", "protocol": "agent protocol"}


def engine_scale(d: dict[str, Any]) -> list[str]:
    """``python -m bench.engine_scale``: the engine process alone on null browser workers."""
    cfg, rows = field(d, "config", source="engine_scale"), field(d, "rows", source="engine_scale")
    lines = [f"The engine process alone on at least {cfg['workers']} null browser workers (`bench/null_worker.py`: an "
             f"instant answer with a pre-encoded JPEG; more at the larger levels, where a ring's 4,096 slots are fewer "
             f"than two per rollout), {cfg['steps']} steps per episode, a {num_text(cfg['seconds'])} s window per "
             f"level, each level in a fresh process, the run directory on `{cfg.get('run_root')}`.", ""]
    lines += table(("policy", "rollouts", "null workers", "steps/s", "engine CPU per step", "its event loop per step",
                    "loop busy", "frame writer busy", "its CPU per frame", "step p50 / p95", "USS per rollout",
                    "frames inline", "errors"),
                   ((POLICY_NAMES.get(r["policy"], r["policy"]), num_text(r["concurrency"]), r["workers"],
                     num_text(r["steps_per_s"]), f"{num_text(r['engine_cpu_ms_per_step'])} ms",
                     f"{num_text(r['loop_cpu_ms_per_step'])} ms", pct(r["loop_busy"]),
                     pct(_writer_busy(r)), _writer_ms_per_frame(r),
                     f"{num_text(r['step_p50_ms'])} / {num_text(r['step_p95_ms'])} ms",
                     f"{num_text(r['uss_per_rollout_kib'])} KiB", _inline_share(r), r.get("errors", 0))
                    for r in rows))
    lines.append("")
    gc_rows = [r for r in rows if "gc_share_of_loop" in r]
    if gc_rows:
        lines.append(f"- The garbage collector's share of the event loop's CPU: "
                     f"{pct_range([r['gc_share_of_loop'] for r in gc_rows])}.")
    profiles = [r for r in rows if r.get("pyspy")]
    for r in profiles:
        top = ", ".join(f"`{t['function']}` {pct(t['share'])}" for t in r["pyspy"]["top_own"][:3])
        lines.append(f"- py-spy at {num_text(r['concurrency'])} rollouts ({POLICY_NAMES.get(r['policy'], r['policy'])}"
                     f"), the functions with the most own samples: {top}.")
    return lines + ([""] if profiles or gc_rows else [])


def _writer_busy(row: dict[str, Any]) -> float:
    """The share of a core the frame writer thread (``engine.store.frame_writer.THREAD_NAME``) used in a level."""
    return float(row["engine_threads_cpu_busy"].get("frame-writer", 0.0))


def _writer_ms_per_frame(row: dict[str, Any]) -> str:
    """The frame writer thread's CPU per screenshot written (one per step)."""
    return f"{_writer_busy(row) * row['window_s'] * 1000 / max(1, row['steps']):.3f} ms"


def _inline_share(row: dict[str, Any]) -> str:
    """The share of a level's frames that came inline through the socket (its rings were full); "-" when the row
    predates the count."""
    if "inline_frames" not in row:
        return "-"
    return pct(row["inline_frames"] / max(1, row["steps"]))


def envs(d: dict[str, Any]) -> list[str]:
    """``python -m bench.envs``: N ``AsyncWebEnv``s against ``run``'s own N rollouts."""
    windows = field(d, "windows", source="envs")
    ranges = {side: [w["steps_per_s"] for w in windows if w["side"] == side] for side in ("run", "env")}

    def steps(side: str) -> str:
        vals = ranges[side]
        return range_text(d[f"{side}_steps_per_s"], min(vals, default=None), max(vals, default=None), len(vals))

    met = d["cost_pct"] <= d["goal_cost_pct"]
    return [f"{d['envs']} `AsyncWebEnv`s driven by a trivial loop against the engine driving {d['envs']} rollouts "
            f"itself with the instant policy, {d['workers']} workers, {len(windows)} alternating "
            f"{num_text(d['window_s'])} s windows.", "",
            *table(("", "run (instant policy)", "AsyncWebEnv", "env / run"),
                   (("steps/s, median [min-max]", steps("run"), steps("env"), num_text(d["ratio_env_over_run"])),
                    ("engine process CPU per step, median", f"{num_text(d['run_engine_cpu_ms_per_step'])} ms",
                     f"{num_text(d['env_engine_cpu_ms_per_step'])} ms", ""))),
            "", f"Cost of the env API in steps/s: {stored(d['cost_pct'])}% (goal: at most "
            f"{stored(d['goal_cost_pct'])}%; {'met' if met else 'missed'}).", ""]


def omnibox(d: dict[str, Any]) -> list[str]:
    """``python -m bench.omnibox``: the browser server on the original's workload, against the engine's loop."""
    lo, hi = d["original_steps_per_s"]
    results = sorted(field(d, "results", source="omnibox").items(), key=lambda kv: int(kv[0]))
    lines = [f"Each client leases a browser, visits a {d['pages']} page, does {d['steps_per_episode']} x (click + "
             f"screenshot) and resets; the same episodes also run through the engine's own loop on the same core. "
             f"{d['workers']} browser workers, {num_text(d['window_s'])} s windows, "
             f"{plural(d['repeats'], 'repeat')}. The original server: {lo:g}-{hi:g} steps/s"
             + (f" ({d['original']['measured']})" if d.get("original") else "") + f". Goal: {d['goal']}.", ""]
    lines += table(("clients", "HTTP steps/s", "engine loop steps/s", "HTTP / engine", "x the original",
                    "PSS per lease", "of the original's per instance"),
                   ((c, num_text(r["http_steps_per_s"]), num_text(r["engine_steps_per_s"]),
                     num_text(r["http_over_engine"]), f"{r['x_original'][0]:g}-{r['x_original'][1]:g}x",
                     f"{num_text(r['pss_mib_per_lease'])} MiB",
                     f"{r['memory_fraction_of_original'] * 100:.1f}% "
                     f"(of {num_text(r['original_mib_per_instance'])} MiB)")
                    for c, r in results))
    commands = sorted({cmd for _, r in results for cmd in r.get("latency_ms", {})})
    if commands:
        lines += ["", "Per command, p50 / p95 ms (client side, the last window of each client count):", ""]
        lines += table(("clients", *commands),
                       ((c, *(_p50_p95(r["latency_ms"].get(cmd)) for cmd in commands)) for c, r in results))
    http = [w for w in d.get("windows", []) if w["side"] == "http"]
    if http:
        chromium = [w["cpu_ms_per_step"]["chromium"] for w in http]
        shares = [w["cpu_ms_per_step"]["chromium"] / sum(w["cpu_ms_per_step"].values()) for w in http]
        busy = [w["cpu_busy_fraction"] for w in http]
        lines += ["", f"In the HTTP windows Chromium took {span(chromium, 'ms')} of CPU per step, {pct_range(shares)} "
                      f"of the stack's, with the machine's CPUs {pct_range(busy)} busy."]
    return [*lines, ""]


def _p50_p95(lat: dict[str, Any] | None) -> str:
    return "" if not lat else f"{num_text(lat['p50'])} / {num_text(lat['p95'])}"


def rl_loop(d: dict[str, Any]) -> list[str]:
    """``python -m bench.rl_loop``: the RL loop, synchronous against asynchronous."""
    cfg = field(d, "config", source="rl_loop")
    modes = [("sync", "sync"), ("async", f"async (staleness {cfg['staleness']})")]
    return [f"Same tasks, model and settings in both modes: {cfg['iterations']} iterations of {cfg['concurrency']} "
            f"episodes of up to {cfg['steps']} steps and {cfg['train_steps']} optimizer steps each, replies paced "
            "by the latency model.", "",
            *table(("mode", "iterations/min", "rollout wait / iteration", "training / iteration",
                    "browser slots busy while training", "policy idle while training"),
                   ((label, num_text(d[m]["iterations_per_min"]), f"{num_text(d[m]['rollout_wait_s'])} s",
                     f"{num_text(d[m]['train_s'])} s", pct(d[m]["browser_busy_training"]),
                     pct(d[m]["policy_idle_training"])) for m, label in modes)),
            "", f"async / sync: {num_text(d['ratio_async_sync'])}x; the bound (R + T) / max(R, T) for this mix is "
            f"{num_text(d['ratio_bound'])}x.", ""]


def request_rules(d: dict[str, Any]) -> list[str]:
    """``python -m bench.request_rules``: what refusing ads and trackers saves on ad-heavy pages."""
    cfg, s = field(d, "config", source="request_rules"), field(d, "summary", source="request_rules")
    return [f"{cfg['episodes']} episodes of {cfg['steps']} steps, {cfg['concurrency']} at a time, on the heavy pages "
            f"with {cfg['ads']} third-party ad scripts each; {cfg['repeats']} runs per side, alternating.", "",
            *table(("request rules", "steps/s", "Chromium CPU per step", "stack CPU per step", "ad requests"),
                   ((side, num_text(s[side]["steps_per_s"]), f"{num_text(s[side]['chromium_ms_per_step'])} ms",
                     f"{num_text(s[side]['stack_ms_per_step'])} ms", num_text(s[side]["ad_requests"]))
                    for side in ("without", "with"))),
            "", f"Chromium CPU saved: {stored(s['chromium_cpu_saved_pct'])}%; steps/s with / without the rules: "
            f"{num_text(s['steps_per_s_ratio'])}x.", ""]


def reply_parsing(d: dict[str, Any]) -> list[str]:
    """``python -m bench.reply_parsing``: how long reading a reply takes, per action format."""
    return [*table(("format", "replies", "mean length", "p50", "p99", "max", "gave an action"),
                   ((r["format"], num_text(r["replies"]), f"{num_text(r['mean_chars'])} chars",
                     f"{num_text(r['p50_us'])} µs", f"{num_text(r['p99_us'])} µs", f"{num_text(r['max_us'])} µs",
                     f"{r['actions_share'] * 100:.1f}%") for r in field(d, "rows", source="reply_parsing"))), ""]


def transport(d: dict[str, Any]) -> list[str]:
    """``python -m bench.transport``: CURVE against plain tcp on the worker socket."""
    b, e, mb = d["browser_steps_per_s"], d["echo_round_trips_per_s"], d["echo_mb_per_s"]
    return [f"{d['concurrency']} sessions, {num_text(d['seconds'])} s windows, {d['repeats']} repeats; the echo "
            f"carries {num_text(d['payload_bytes'])} bytes (a screenshot's size).", "",
            *table(("", "plain tcp", "CURVE", "CURVE / plain"),
                   (("browser steps/s", num_text(b["plain"]), num_text(b["curve"]), num_text(b["curve_over_plain"])),
                    ("echo round trips/s", num_text(e["plain"]), num_text(e["curve"]), num_text(e["curve_over_plain"])),
                    ("echo MB/s", num_text(mb["plain"]), num_text(mb["curve"]), ""))), ""]


def netpolicy(d: dict[str, Any]) -> list[str]:
    """``python -m bench.netpolicy``: what the network policy for pages costs."""
    cfg = field(d, "settings", source="netpolicy")
    runs = {side: sum(r["policy"] == side for r in d["runs"]) for side in ("on", "off")}
    return [f"{cfg['repeats']} runs per side, alternating, of {cfg['episodes']} episodes at {cfg['concurrency']} "
            f"concurrent with {cfg['workers']} workers.", "",
            *table(("network policy", "steps/s, median [min-max]"),
                   ((side, range_text(d[f"{side}_steps_per_s"], d[f"{side}_range"][0], d[f"{side}_range"][1],
                                      runs[side]))
                    for side in ("on", "off"))),
            "", f"on / off: {stored(d['ratio'])} (a cost of {stored(d['cost_percent'])}%).", ""]


def tmpfs_writes(d: dict[str, Any]) -> list[str]:
    """``python -m bench.tmpfs_writes``: a screenshot file's write by itself, as a run's memory grows."""
    cfg, passes = field(d, "config", source="tmpfs_writes"), field(d, "passes", source="tmpfs_writes")
    names = [p["pass"] for p in passes]
    rows = zip(*(p["rows"] for p in passes), strict=True)
    return [f"Files of {num_text(cfg['file_bytes'])} bytes written into `{cfg['root']}`, {cfg['files_per_call']} per "
            f"call of the frame writer's `write_files`; {num_text(cfg['gib'])} GiB per pass; the window pass removes "
            f"each file once {num_text(cfg['window_gib'])} GiB more is written. CPU per file, by GiB written:", "",
            *table(("GiB written", *names),
                   ((num_text(r[0]["gib_written"]), *(f"{num_text(x['cpu_us_per_file'])} µs" for x in r))
                    for r in rows)), ""]


# File stem -> (the command that writes it, its renderer).
STANDALONE: dict[str, tuple[str, Callable[[dict[str, Any]], list[str]]]] = {
    "engine_scale": ("python -m bench.engine_scale", engine_scale),
    "envs": ("python -m bench.envs", envs),
    "netpolicy": ("python -m bench.netpolicy", netpolicy),
    "omnibox": ("python -m bench.omnibox", omnibox),
    "omnibox-100-steps": ("python -m bench.omnibox --clients 8 --steps 100 --window 15", omnibox),
    "reply_parsing": ("python -m bench.reply_parsing", reply_parsing),
    "request_rules": ("python -m bench.request_rules", request_rules),
    "rl_loop": ("python -m bench.rl_loop", rl_loop),
    "tmpfs_writes": ("python -m bench.tmpfs_writes", tmpfs_writes),
    "transport": ("python -m bench.transport", transport),
}


def standalone_section(name: str, data: dict[str, Any], plots_prefix: str) -> list[str]:
    """One standalone benchmark's section: its ``summary`` rows, or its own renderer's text."""
    command = STANDALONE[name][0] if name in STANDALONE else None
    where = f"[benchmarks/{name}.json](benchmarks/{name}.json)"
    lines = [f"## {name}", "", f"Stored in {where}" + (f" by `{command}`." if command else "."), ""]
    if summary_of(data) is not None:
        return lines + summary_section(data, plots_prefix)
    if name in STANDALONE:
        return lines + read_with(STANDALONE[name][1], data, name)
    return lines + ["No `summary` rows to render.", ""]


def read_with(renderer: Callable[[Any], list[str]], arg: Any, source: str) -> list[str]:
    """``renderer(arg)``, a stored file's shape it does not know raised as a :class:`FigureError` naming both."""
    try:
        return renderer(arg)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        where = f"docs/benchmarks/{source}.json" if source else "the stored results in docs/benchmarks/"
        raise FigureError(f"{renderer.__name__} cannot read {where} (a changed shape? {type(exc).__name__}: {exc})"
                          ) from exc


# --- the page ------------------------------------------------------------------------------------------------
FOOTER = ("Rendered from the JSON files in `docs/benchmarks/` by `python -m bench.publish`, which also renders the "
          "README's figure blocks (`--check` fails when either differs from what the stored results render to); "
          "`webgym-engine bench SUITE... --publish docs` stores a run's results there first and renders with the same "
          "code. A benchmark that stores a top-level `summary` list of rows `{figure, value, unit, goal, met}` (with "
          "optional `plots` and `notes`) gets its section here and a line in the README's \"At a glance\" with no "
          "code of its own. The suites' methods are in `bench/suites/`, each standalone benchmark's in its module in "
          "`bench/`.")


def benchmarks_page(store: Store) -> str:
    """``docs/benchmarks.md``: the suites' figures, then a section per standalone benchmark."""
    order = {name: i for i, name in enumerate(SUITE_NAMES)}
    suites = sorted((d for d in store.values() if is_suite(d)), key=lambda d: (order.get(d["suite"], 99), d["suite"]))
    others = {name: d for name, d in store.items() if not is_suite(d)}
    lines = ["# Benchmarks", "",
             "Every stored benchmark result. A suite's value is the median over its repeats, with [min-max].", "",
             *suites_markdown(suites, "benchmarks/", others)]
    for name in sorted(others):
        lines += standalone_section(name, others[name], "benchmarks/")
    lines += [FOOTER]
    return "\n".join(lines) + "\n"
