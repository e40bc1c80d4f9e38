"""The README's figure blocks, rendered from the stored results.

A page marks a block with ``<!-- figures: NAME -->`` ... ``<!-- /figures -->``; :func:`render_block` gives the
Markdown between the markers. :data:`BLOCKS` holds one function per named block; ``summary:STEM`` renders the
``summary`` rows of ``docs/benchmarks/STEM.json`` (the convention for new benchmarks) with no code of its own.
Every number comes from a stored file; a figure that is not stored raises :class:`bench.render.FigureError`,
and a suite that was skipped is said to be so, with its reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from bench import page_latency
from bench.render import (
    FigureError,
    Store,
    figure,
    goal_rows,
    is_suite,
    machine_groups,
    need,
    pct_range,
    read_with,
    span,
    stored,
    summary_of,
    summary_value,
    table,
)
from bench.render import value_text as _value_text
from bench.suite import num_text

_NBSP = "\u00a0"  # joins the words of one figure while wrapping; a plain space in the output


def keep(text: str) -> str:
    """``text`` kept on one source line when the block is wrapped."""
    return text.replace(" ", _NBSP)


def value_text(fig: dict[str, Any]) -> str:
    """A stored figure as ``median [min-max] unit``, never split across source lines."""
    return keep(_value_text(fig))


def slashed(values: Sequence[str]) -> str:
    """``a / b / c``, never split across source lines."""
    return keep(" / ".join(values))


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _where(fig: dict[str, Any]) -> str:
    """The level a suite's figure is at: its label before the colon (``light c16``)."""
    return fig["label"].split(":", 1)[0]


def _matching(data: dict[str, Any], pattern: str, with_goal: bool = False) -> list[tuple[re.Match[str], dict]]:
    """The suite's figures whose key matches ``pattern``, in stored order (none is an error)."""
    rx = re.compile(pattern)
    found = [(m, f) for k, f in data["figures"].items() if (m := rx.fullmatch(k)) and (f.get("goal") or not with_goal)]
    if not found:
        raise FigureError(f"docs/benchmarks/{data['suite']}.json has no figure matching {pattern!r}")
    return found


def _missed(fig: dict[str, Any]) -> str:
    return " (missed)" if fig.get("met") is False else ""


def _goals(figs: Sequence[dict[str, Any]]) -> str:
    return ", ".join(dict.fromkeys(f["goal"] for f in figs if f.get("goal")))


def _skipped(store: Store, suite: str, title: str, what: str) -> str | None:
    """The bullet for a suite that was skipped in the stored run, else None."""
    data = need(store, suite)
    if not data.get("skipped"):
        return None
    return (f"- **{title}** ({what}): not measured in the stored results (the `{suite}` suite was skipped: "
            f"{data['skipped']}).")


# --- at a glance ---------------------------------------------------------------------------------------------
def machine(store: Store) -> str:
    """The machine the suites' stored results were measured on (each, when they differ), and the code's revision."""
    groups = machine_groups([d for d in store.values() if is_suite(d)])
    if not groups:
        raise FigureError("docs/benchmarks/ holds no suite result")

    def text(m: dict[str, Any]) -> str:
        gpu = m.get("gpu")
        return (f"{m.get('cores')} cores ({m.get('cpu_model') or 'unknown CPU'}), {num_text(m.get('memory_gib'))} GiB, "
                f"{m.get('chromium') or 'Chromium'}, {gpu['name'] if gpu else 'no GPU'}; code "
                f"{m.get('git_revision') or 'of an unknown revision'}")

    if len(groups) == 1:
        return f"- **Machine** (the suites' stored run): {text(groups[0][0])}."
    return "- **Machines**: " + "; ".join(f"{text(m)} ({', '.join(names)})" for m, names in groups) + "."


def _goal_levels(store: Store, suite: str, label: str, what: str, pattern: str, shown: str) -> str:
    """One bullet: ``suite``'s figures matching ``pattern`` that have a goal, each with its level and whether it
    was met (``shown``: what the parenthesis says before the goal)."""
    if skipped := _skipped(store, suite, label, what):
        return skipped
    figs = [f for _, f in _matching(need(store, suite), pattern, with_goal=True)]
    items = ", ".join(f"{_where(f)} {value_text(f)}{_missed(f)}" for f in figs)
    return f"- **{label}** ({shown}goal {_goals(figs)}): {items}."


def ceiling(store: Store) -> str:
    """Engine / bare loop at the levels with a goal (the ceiling suite)."""
    what = "the engine with the instant policy against a bare loop of CDP click + JPEG screenshot, same pages"
    return _goal_levels(store, "ceiling", "Engine / bare loop", what, r"\w+\.c\d+\.ratio", f"steps/s: {what}; ")


def engine_cpu(store: Store) -> str:
    """The engine's CPU per step: the instant policy's range (scaling) and the full protocol's (overhead)."""
    what = "the engine process's CPU per step"
    if skipped := _skipped(store, "scaling", "Engine CPU per step", what):
        return skipped
    found = _matching(need(store, "scaling"), r"(?P<profile>\w+)\.c(?P<n>\d+)\.engine_cpu_ms_per_step")
    figs = [f for _, f in found]
    medians = [f["median"] for f in figs]
    profiles = list(dict.fromkeys(m["profile"] for m, _ in found))
    levels = sorted(int(m["n"]) for m, _ in found)
    missed = sum(f.get("met") is False for f in figs)
    line = (f"- **Engine CPU per step** (goal {_goals(figs)}): {num_text(min(medians))}-{num_text(max(medians))} ms "
            f"with the instant policy (the medians on the {_and(profiles)} pages, {levels[0]} to {levels[-1]} "
            f"rollouts{f'; {missed} missed' if missed else ''})")
    if need(store, "overhead").get("skipped"):
        return line + "."
    o = figure(need(store, "overhead"), "cpu_ms_per_step")
    other_goal = "" if o.get("goal") in (None, _goals(figs)) else f", goal {o['goal']}"
    return (f"{line}; {value_text(o)} with the simulated policy and Set-of-Marks at "
            f"{need(store, 'overhead')['config']['concurrency']} rollouts{other_goal}{_missed(o)}.")


def browser_memory(store: Store) -> str:
    """Browser PSS per rollout at the levels with a goal (the scaling suite)."""
    what = "the browsers' PSS over the concurrent rollouts"
    return _goal_levels(store, "scaling", "Browser PSS per rollout", what, r"\w+\.c\d+\.pss_per_rollout_mib", "")


WHOLE_BATCHES = ("whole batches of 4 x C episodes of the bundled tasks, Set-of-Marks, the simulated model calibrated "
                 "to a Qwen-VL 7B on one H100")


def async_sync(store: Store) -> str:
    """Asynchronous against lock-step on the bundled sites: the ``async`` suite's ``summary`` rows."""
    return _whole_batches(store, "async", "Asynchronous / lock-step", WHOLE_BATCHES)


def async_live(store: Store) -> str:
    """Asynchronous against lock-step with live-web page loads: the ``async_live`` suite's ``summary`` rows."""
    return _whole_batches(store, "async_live", "Asynchronous / lock-step, live-web page loads",
                          f"{WHOLE_BATCHES}; `bench/page_latency.py`: {page_latency.describe()}")


def _whole_batches(store: Store, suite: str, title: str, what: str) -> str:
    if skipped := _skipped(store, suite, title, what):
        return skipped
    data = need(store, suite)
    if not summary_of(data):
        raise FigureError(f"docs/benchmarks/{suite}.json has no `summary` list")
    return f"- **{title}** ({what}): {summary_items(data)}."


def engine_alone(store: Store) -> str:
    """The engine process alone on null workers: steps/s per policy and level (engine_scale.json)."""
    rows = need(store, "engine_scale").get("rows") or []
    if not rows:
        raise FigureError("docs/benchmarks/engine_scale.json has no rows")
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        by_policy.setdefault(r["policy"], []).append(r)
    names = {"instant": "the instant policy", "protocol": "the full agent protocol"}
    level_sets = {tuple(r["concurrency"] for r in rs) for rs in by_policy.values()}
    parts = []
    for policy, rs in by_policy.items():
        part = f"{names.get(policy, policy)} {slashed([num_text(r['steps_per_s']) for r in rs])} steps/s"
        if len(level_sets) > 1:
            part += f" at {slashed([num_text(r['concurrency']) for r in rs])} rollouts"
        parts.append(part)
    levels = "" if len(level_sets) > 1 else f" at {slashed([num_text(n) for n in next(iter(level_sets))])} rollouts"
    busy = [r["loop_busy"] for r in rows]
    return (f"- **Engine alone** (`python -m bench.engine_scale`: the engine process on null browser workers that "
            f"answer at once): {'; '.join(parts)}{levels}; its event loop {pct_range(busy)} busy.")


def image_path(store: Store) -> str:
    """The image path against Pillow (the codec suite)."""
    what = "`engine/_imgcodec` against Pillow, medians"
    if skipped := _skipped(store, "codec", "Image path", what):
        return skipped
    data = need(store, "codec")
    cases = (("decode_resize", "decode + resize to the Qwen-VL grid"), ("decode", "decode"),
             ("som_pipeline", "Set-of-Marks (decode + boxes + encode)"))
    items = [f"{label} {num_text(figure(data, f'{case}.imgcodec_ms')['median'])} ms against "
             f"{num_text(figure(data, f'{case}.pillow_ms')['median'])} ms "
             f"({num_text(figure(data, f'{case}.speedup_vs_pillow')['median'])}x)" for case, label in cases]
    return f"- **Image path** ({what}): {'; '.join(items)}."


def model_batching(store: Store) -> str:
    """The ``hf`` backend's batching on a GPU, or that no GPU run is stored (the policy suite)."""
    what = "the `hf` backend's dynamic batching on a random-weight Qwen2.5-VL-architecture model"
    data = need(store, "policy")
    if data.get("skipped") and "policy_batching" in store:
        return _standalone_batching(what, store["policy_batching"])
    if data.get("skipped"):
        return (f"- **Model batching** ({what}): not measured on a GPU in the stored results (the `policy` suite "
                f"was skipped: {data['skipped']}).")
    levels = sorted(int(m["n"]) for m, _ in _matching(data, r"c(?P<n>\d+)\.requests_per_s"))
    top, gpu = levels[-1], (data.get("machine") or {}).get("gpu") or {}
    return (f"- **Model batching** ({what}, {gpu.get('name', 'a GPU')}): "
            f"{value_text(figure(data, f'c{top}.requests_per_s'))} at {top} concurrent requests, "
            f"{num_text(figure(data, f'c{top}.speedup')['median'])}x one request's "
            f"{num_text(figure(data, f'c{levels[0]}.requests_per_s')['median'])}.")


def _standalone_batching(what: str, data: dict[str, Any]) -> str:
    """Model batching from ``python -m bench.policy --json`` (policy_batching.json): the backend's own attention at
    the highest concurrency against one request, and its speed-up over transformers' vision attention."""
    rows = [r for r in data.get("rows") or [] if r.get("vision_attention") == "varlen"]
    if not rows:
        raise FigureError("policy_batching.json has no varlen rows")
    one, top = min(rows, key=lambda r: r["concurrency"]), max(rows, key=lambda r: r["concurrency"])
    gpu = (data.get("machine") or {}).get("gpu") or {}
    before = {r["concurrency"]: r["requests_per_s"] for r in data.get("rows") or []
              if r.get("vision_attention") == "default" and r["requests_per_s"] > 0}
    pairs = [(r["concurrency"], r["requests_per_s"] / before[r["concurrency"]]) for r in rows
             if r["concurrency"] in before]
    versus = (f"; the varlen vision attention serves {slashed([num_text(x) for _, x in pairs])}x the requests/s of "
              f"transformers' own at {slashed([str(c) for c, _ in pairs])} concurrent") if pairs else ""
    return (f"- **Model batching** ({what}, {gpu.get('name', 'a GPU')}, `python -m bench.policy`): "
            f"{num_text(top['requests_per_s'])} requests/s at {top['concurrency']} concurrent requests, "
            f"{num_text(top['requests_per_s'] / one['requests_per_s'])}x one request's "
            f"{num_text(one['requests_per_s'])}{versus}.")


OWN_BLOCK = {"test_time"}  # standalone results that the README shows in a block of their own, not at a glance


def standalone_summaries(store: Store) -> list[str]:
    """One bullet per standalone benchmark whose ``summary`` rows include goals, with those rows alone (every row
    is in docs/benchmarks.md; a file of computed figures with no goal has no bullet)."""
    bullets = []
    for name, data in sorted(store.items()):
        if name in OWN_BLOCK:
            continue
        headline = [r for r in summary_of(data) or [] if r.get("goal")] if not is_suite(data) else []
        if headline:
            bullets.append(f"- **{data.get('title') or name}** ([docs/benchmarks/{name}.json]"
                           f"(docs/benchmarks/{name}.json)): {summary_items({'summary': headline})}.")
    return bullets


def at_a_glance(store: Store) -> list[str]:
    """The README's "At a glance" figures: the suites', the engine alone, then every standalone benchmark with
    ``summary`` rows."""
    return [*(f(store) for f in (machine, ceiling, engine_cpu, browser_memory, async_sync, async_live, engine_alone,
                                 image_path, model_batching)), *standalone_summaries(store)]


# --- the README's headline table -----------------------------------------------------------------------------
Row = tuple[str, str, str]  # what (with the stored file it comes from), value, goal (with met or missed)


def _goal_cell(goal: str | None, met: bool | None) -> str:
    if not goal:
        return ""
    return goal + ("" if met is None else (": met" if met else ": **missed**"))


def _from(what: str, stem: str) -> str:
    return f"{what} ([{stem}](docs/benchmarks/{stem}.json))"


def _summary_row(store: Store, stem: str, name: str) -> dict[str, Any]:
    for r in summary_of(need(store, stem)) or []:
        if r["figure"] == name:
            return r
    raise FigureError(f"docs/benchmarks/{stem}.json has no summary row {name!r}")


def _summary_cells(store: Store, stem: str, name: str, what: str) -> Row:
    r = _summary_row(store, stem, name)
    return _from(what, stem), summary_value(r), _goal_cell(r.get("goal"), r.get("met"))


def _suite_span(store: Store, suite: str, pattern: str, what: str, unit: str = "") -> Row | None:
    """The medians of ``suite``'s figures matching ``pattern`` that have a goal, as one range (None when the stored
    run skipped the suite)."""
    if need(store, suite).get("skipped"):
        return None
    figs = [f for _, f in _matching(need(store, suite), pattern, with_goal=True)]
    verdicts = [f["met"] for f in figs if f.get("met") is not None]
    return (_from(what, suite), span([f["median"] for f in figs], unit),
            _goal_cell(_goals(figs), all(verdicts) if verdicts else None))


def _browser_server(store: Store) -> Row:
    d = need(store, "omnibox")
    x = [v["x_original"] for v in d["results"].values()]
    goal = d["goal"].partition(";")[0].strip()
    target = re.search(r">= ([\d.]+)x", goal)
    met = None if target is None else min(lo for lo, _ in x) >= float(target[1])
    what = "WebGym's browser server API on its own workload: steps/s, this engine / the original"
    if d.get("original"):
        what += " (measured elsewhere)"
    return (_from(what, "omnibox"),
            f"{min(lo for lo, _ in x):g}-{max(hi for _, hi in x):g}x", _goal_cell(goal, met))


def _engine_alone(store: Store) -> Row:
    rows = need(store, "engine_scale").get("rows") or []
    if not rows:
        raise FigureError("docs/benchmarks/engine_scale.json has no rows")
    levels = [r["concurrency"] for r in rows]
    return (_from(f"Engine alone on null workers, {num_text(min(levels))}-{num_text(max(levels))} rollouts",
                  "engine_scale"), span([r["steps_per_s"] for r in rows], "steps/s"), "")


def _image_path(store: Store) -> Row | None:
    data = need(store, "codec")
    if data.get("skipped"):
        return None
    fig = figure(data, "decode_resize.speedup_vs_pillow")
    return (_from("Image path, decode + resize to the Qwen-VL grid: Pillow's time / the engine's", "codec"),
            f"{num_text(fig['median'])}x", _goal_cell(fig.get("goal"), fig.get("met")))


def _grpo(store: Store) -> Row:
    low = _summary_row(store, "grpo_demo", "gain S1 - S0 (1/k): 95% interval, low end")
    high = _summary_row(store, "grpo_demo", "gain S1 - S0 (1/k): 95% interval, high end")
    gain = _summary_row(store, "grpo_demo", "gain S1 - S0 (1/k)")
    s0 = _summary_row(store, "grpo_demo", "S0: held-out success after the warm start")
    s1 = _summary_row(store, "grpo_demo", "S1: held-out success after GRPO (1/k)")
    return (_from("GRPO on the CPU, held-out success: gain S1 - S0 [95% interval]", "grpo_demo"),
            f"{gain['value']:+.2f} [{low['value']:+.2f}, {high['value']:+.2f}] ({num_text(s0['value'])}% -> "
            f"{num_text(s1['value'])}%)", _goal_cell(f"{gain['goal']}, interval > 0", gain["met"] and low["met"]))


def headline_rows(store: Store) -> list[Row]:
    """The README's headline figures, one row each; a suite that the stored run skipped has none."""
    soak = _summary_row(store, "soak", "episodes")
    rows = [
        _browser_server(store),
        _suite_span(store, "ceiling", r"\w+\.c\d+\.ratio", "Engine / a bare CDP loop, steps/s on the same pages"),
        _suite_span(store, "scaling", r"\w+\.c\d+\.engine_cpu_ms_per_step",
                    "Engine CPU per step, instant policy, 8 to 256 rollouts", "ms"),
        _suite_span(store, "scaling", r"\w+\.c128\.pss_per_rollout_mib",
                    "Browser memory (PSS) per rollout, 128 rollouts", "MiB"),
        _summary_cells(store, "async_live", "async / sync, whole batch, 32 rollouts",
                       "Asynchronous / lock-step, live-web page loads, 32 rollouts"),
        _engine_alone(store),
        _image_path(store),
        _grpo(store),
        _summary_cells(store, "grpo_demo", "control's gain S1 - S0", "GRPO's control, rewards shuffled: gain"),
        _summary_cells(store, "chaos", "tasks without a record",
                       "Chaos run (workers and browsers killed, links cut): tasks without a record"),
        _summary_cells(store, "soak", "engine process (USS) slope after warm-up",
                       f"Soak, {num_text(soak['value'])} episodes: the engine's memory growth"),
    ]
    return [r for r in rows if r is not None]


def headline(store: Store) -> list[str]:
    """The README's one table of headline figures (figure | value | goal), each row naming its stored file."""
    return [keep(line) for line in table(("figure", "value", "goal"), headline_rows(store))]


# --- figures elsewhere in the README -------------------------------------------------------------------------
def env_api(store: Store) -> list[str]:
    """The env API against ``run``'s rollouts (``bench.envs``)."""
    d = need(store, "envs")
    return [f"What the env API costs against `run`'s own rollouts on the same pages (`python -m bench.envs`, "
            f"{d['envs']} envs, {d['workers']} workers, stored in [docs/benchmarks/envs.json]"
            f"(docs/benchmarks/envs.json)): env / run {num_text(d['ratio_env_over_run'])} in steps/s, "
            f"{num_text(d['run_engine_cpu_ms_per_step'])} ms (run) and {num_text(d['env_engine_cpu_ms_per_step'])} ms "
            "(env) of engine CPU per step ([docs/measured.md](docs/measured.md))."]


def rl_loop(store: Store) -> list[str]:
    """The RL loop, synchronous against asynchronous (``bench.rl_loop``)."""
    d = need(store, "rl_loop")
    below = d["ratio_async_sync"] < d["ratio_bound"]
    return ["Synchronous vs asynchronous loop (`python -m bench.rl_loop`, stored in "
            "[docs/benchmarks/rl_loop.json](docs/benchmarks/rl_loop.json)): "
            f"{num_text(d['sync']['iterations_per_min'])} vs {num_text(d['async']['iterations_per_min'])} "
            f"iterations/min, {num_text(d['ratio_async_sync'])}x, against a bound of {num_text(d['ratio_bound'])}x "
            f"for that mix of rollout and training time{' (what holds it below: next)' if below else ''}."]


def grpo_demo(store: Store) -> list[str]:
    """Reinforcement learning through the engine on the CPU (``bench.grpo_demo``)."""
    d = need(store, "grpo_demo")
    runs = d["runs"]

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    def gain(run: dict[str, Any]) -> str:
        g = run["gain"]
        low, high = g["interval_95"]
        return f"{g['gain']:+.2f} [95% interval {low:+.2f} to {high:+.2f}]"

    grpo = runs["grpo"]
    parts = [f"held-out success rose from S0 {pct(grpo['start']['success_rate'])} to S1 "
             f"{pct(grpo['end']['success_rate'])} with GRPO (1/k), a gain of {gain(grpo)} over "
             f"{grpo['gain']['tasks']} boards never trained on ({grpo['gain']['episodes']} episodes)"]
    if "control" in runs:
        c = runs["control"]
        parts.append(f"the control with the rewards shuffled in each group went from {pct(c['start']['success_rate'])} "
                     f"to {pct(c['end']['success_rate'])} ({gain(c)})")
    if "tau" in runs:
        t = runs["tau"]
        parts.append(f"with the 1/|tau| normaliser S1 was {pct(t['end']['success_rate'])} ({gain(t)}), episodes "
                     f"{num_text(t['end']['mean_steps'])} steps long on average against "
                     f"{num_text(grpo['end']['mean_steps'])} with 1/k")
    lines = [f"Measured (`python -m bench.grpo_demo`, stored in "
             f"[docs/benchmarks/grpo_demo.json](docs/benchmarks/grpo_demo.json), {num_text(d['wall_s'] / 60)} min on "
             f"{d['machine'].get('cores')} cores): " + "; ".join(parts) + "."]
    repeats = d.get("repeats") or []
    if len(repeats) > 1:
        n, g = len(repeats), [r["runs"]["grpo"] for r in repeats]

        def signed(values: list[float]) -> str:
            return f"{min(values):+.2f} to {max(values):+.2f}"

        spread = (f"Over {n} runs of the whole demonstration ({span([r['wall_s'] / 60 for r in repeats])} min each): "
                  f"S0 {span([100 * x['s0'] for x in g], '%')}, S1 {span([100 * x['s1'] for x in g], '%')}, GRPO's "
                  f"gain {signed([x['gain'] for x in g])}, its interval excluding 0 in "
                  f"{sum(x['interval_95'][0] > 0 for x in g)} of {n}")
        if all("control" in r["runs"] for r in repeats):
            c = [r["runs"]["control"] for r in repeats]
            spread += (f"; the control's gain {signed([x['gain'] for x in c])}, no rise (its interval's low end <= 0) "
                       f"in {sum(x['interval_95'][0] <= 0 for x in c)} of {n}")
        lines.append(spread + ".")
    return lines


def request_rules(store: Store) -> list[str]:
    """What refusing ads and trackers saves (``bench.request_rules``)."""
    d = need(store, "request_rules")
    s = d["summary"]
    return ["Ads and trackers can be refused in the worker (`--block-requests hosts.txt`): "
            f"{stored(s['chromium_cpu_saved_pct'])}% of Chromium's CPU saved on pages with {d['config']['ads']} "
            f"third-party ad scripts each, {num_text(s['steps_per_s_ratio'])}x the steps/s "
            "([docs/benchmarks/request_rules.json](docs/benchmarks/request_rules.json))."]


def traffic_replay(store: Store) -> list[str]:
    """Live against recorded and replayed traffic (``bench.traffic_replay``)."""
    d = need(store, "traffic_replay")
    c = d["config"]
    lines = ["The bundled tasks with the scripted policy, same run "
             "([docs/benchmarks/traffic_replay.json](docs/benchmarks/traffic_replay.json), `python -m "
             f"bench.traffic_replay`; {c['episodes']} episodes per run at {c['concurrency']} concurrent on "
             f"{c['workers']} workers; one recording, then {c['repeats']} live and {c['repeats']} replayed runs "
             "alternating; medians):", "",
             "| traffic | steps/s | CPU per step, whole process tree (ms) |", "|---|---|---|"]
    for mode, s in d["summary_by_mode"].items():
        lines.append(f"| {mode} | {num_text(s['steps_per_s']['median'])} | "
                     f"{num_text(s['cpu_ms_per_step']['median'])} |")
    rec = d["record"]
    misses = sum(r["misses"] for r in d["runs"] if r["mode"] == "replay")
    lines += ["", f"Replayed / live: {num_text(d['replay_over_live_steps_per_s'])}x the steps/s, "
              f"{num_text(d['replay_over_live_cpu'])}x the CPU per step; recording costs "
              f"{num_text(d['record_over_live_cpu'])}x the CPU per step of a live run. An archive holds "
              f"{num_text(rec['archive_kib_median'])} KiB per episode (median; at most "
              f"{num_text(rec['archive_kib_max'])} KiB); the replays met {misses} requests the recording lacked. The "
              "bundled sites are local: against live sites a replay also saves the network's time."]
    return lines


def _measured_elsewhere(d: dict[str, Any]) -> str:
    """Where the original server's figures in a ``bench.omnibox`` result come from."""
    original = d.get("original")
    if not original:
        return " on this machine kind"
    dates = _and(sorted({run["date"] for run in original["runs"]}))
    return f", measured elsewhere on this machine kind ({dates}; `bench/peers/omniboxes.json`)"


def omnibox(store: Store) -> list[str]:
    """The browser server on the original's workload (``bench.omnibox``)."""
    d = need(store, "omnibox")
    results = sorted(d["results"].items(), key=lambda kv: int(kv[0]))
    clients = [c for c, _ in results]
    r = [v for _, v in results]
    x_lo, x_hi = min(v["x_original"][0] for v in r), max(v["x_original"][1] for v in r)
    lo, hi = d["original_steps_per_s"]
    speed_goal, _, memory_goal = (g.strip() for g in d["goal"].partition(";"))
    ratios = [v["http_over_engine"] for v in r]
    http = [w for w in d.get("windows", []) if w["side"] == "http"]
    chromium = [w["cpu_ms_per_step"]["chromium"] for w in http]
    shares = [w["cpu_ms_per_step"]["chromium"] / sum(w["cpu_ms_per_step"].values()) for w in http]
    fractions = [f"{v['memory_fraction_of_original'] * 100:.1f}%" for v in r]
    resets = [f"{num_text(v['latency_ms']['reset']['p50'] / 1000)} s" for v in r if "reset" in v.get("latency_ms", {})]

    def per_clients(values: Sequence[str]) -> str:
        return _and([f"{v} with {c} clients" if i == 0 else f"{v} with {c}"
                     for i, (v, c) in enumerate(zip(values, clients, strict=True))])

    lines = [f"Measured here (`python -m bench.omnibox`, {d['workers']} workers, stored in "
             "[docs/benchmarks/omnibox.json](docs/benchmarks/omnibox.json)), on the original's own benchmark workload "
             f"(lease, visit a {d['pages']} page, {d['steps_per_episode']} x click + screenshot, reset):",
             f"- **Speed**: {per_clients([num_text(v['http_steps_per_s']) + ' steps/s' for v in r])}. That is "
             f"{x_lo:g}-{x_hi:g}x the original server's {lo:g}-{hi:g} steps/s{_measured_elsewhere(d)}; the goal: "
             f"{speed_goal}.",
             f"- **The HTTP layer's cost**: {'none measurable. ' if min(ratios) >= 1 else ''}The engine's own loop "
             f"does {_and([num_text(v['engine_steps_per_s']) for v in r])} steps/s on the same core (HTTP / engine "
             f"{_and([num_text(x) for x in ratios])})."
             + (f" Chromium's CPU sets the pace: {span(chromium, 'ms')} per step, "
                f"{pct_range(shares)} of the stack's; each {d['steps_per_episode']}-step episode "
                "has two page loads." if http else ""),
             f"- **Memory**: everything that serves the leases takes "
             f"{per_clients([num_text(v['pss_mib_per_lease']) + ' MiB per lease' for v in r])}. That is "
             f"{_and(fractions)} of the original's "
             f"memory per instance; the goal: {memory_goal}."]
    if len(resets) == len(r):
        lines.append(f"- **Reset**: `/reset` returns the context to the pool in {per_clients(resets)} (p50).")
    return lines


def _summary_item(row: dict[str, Any]) -> tuple[str, str]:
    """A ``summary`` row as (what, ``value (goal ...: met)``)."""
    goal = row.get("goal")
    verdict = "" if row.get("met") is None else (": met" if row["met"] else ": missed")
    return row["figure"], keep(summary_value(row)) + (" " + keep(f"(goal {goal}{verdict})") if goal else "")


def summary_items(data: dict[str, Any]) -> str:
    """A file's ``summary`` rows in one sentence: ``what value (goal ...); ...``."""
    return "; ".join(f"{what} {value}" for what, value in map(_summary_item, summary_of(data) or []))


def summary_block(store: Store, name: str) -> list[str]:
    """``summary:NAME``: the ``summary`` rows of ``docs/benchmarks/NAME.json``, one bullet each."""
    rows = summary_of(need(store, name))
    if rows is None:
        raise FigureError(f"docs/benchmarks/{name}.json has no `summary` list")
    return [f"- **{what}**: {value}" for what, value in map(_summary_item, rows)]


def suite_goals(store: Store) -> list[str]:
    """Every stored suite figure that has a goal, as one table, each suite with its code's revision and start."""
    suites = [d for _, d in sorted(store.items()) if is_suite(d) and not d.get("skipped")]
    rows = goal_rows(suites)
    if not rows:
        raise FigureError("docs/benchmarks/ holds no suite figure with a goal")
    runs = "; ".join(f"{d['suite']}: code {d.get('machine', {}).get('git_revision') or 'of an unknown revision'}, "
                     f"{(d.get('started_at') or '')[:10] or 'on an unknown day'}" for d in suites)
    return [f"Each suite's stored run ({runs}):", "", *(keep(line) for line in table(
        ("suite", "figure", "value", "goal", "met"), rows))]


def async_levels(store: Store, suite: str = "async") -> list[str]:
    """A suite of whole batches (``async``, ``async_live``) as one table of its levels: both modes' makespans, rates
    and CPU, the measured and predicted ratios and their gap."""
    data = need(store, suite)
    levels = sorted(int(m["n"]) for m, _ in _matching(data, r"c(?P<n>\d+)\.ratio"))

    def med(n: int, key: str, unit: str = "") -> str:
        return num_text(figure(data, f"c{n}.{key}")["median"]) + unit

    def ratio(n: int, key: str) -> str:
        f = figure(data, f"c{n}.{key}")
        return f"{num_text(f['median'])}x [{num_text(f['min'])}-{num_text(f['max'])}]"

    rows = [(n, med(n, "async.makespan_s", " s"), med(n, "sync.makespan_s", " s"), med(n, "async.episodes_per_min"),
             med(n, "sync.episodes_per_min"), med(n, "async.steps_per_s"), med(n, "sync.steps_per_s"),
             f"{med(n, 'async.machine_cpu_busy', '%')} / {med(n, 'sync.machine_cpu_busy', '%')}",
             ratio(n, "ratio"), ratio(n, "predicted_ratio"), f"{figure(data, f'c{n}.gap_pct')['median']:+.1f}%")
            for n in levels]
    header = ("rollouts", "async makespan", "sync makespan", "async episodes/min", "sync episodes/min",
              "async steps/s", "sync steps/s", "CPU busy async / sync", "measured ratio", "predicted", "gap")
    return [*(keep(line) for line in table(header, rows)), "",
            f"Medians of {data['repeats']} repeats (each repeat draws other episode lengths and replies: that is most "
            "of the spread); code " + (data.get("machine", {}).get("git_revision") or "of an unknown revision") + "."]


def async_prediction(store: Store) -> list[str]:
    """What the latency model predicts over task mixes, browser times and concurrencies (``bench.async_prediction``),
    one row per browser profile and mix, one column per concurrency."""
    rows = need(store, "async_prediction").get("table") or []
    if not rows:
        raise FigureError("docs/benchmarks/async_prediction.json has no table")
    levels = sorted({r["concurrency"] for r in rows})
    cells: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        cells.setdefault((r["browser"], r["mix"]), {})[r["concurrency"]] = r["ratio"]
    header = ("browser time per step", "task mix (step caps)", *(f"{n} rollouts" for n in levels))
    return [keep(line) for line in table(header, [(b, m, *(f"{num_text(by[n])}x" if n in by else "" for n in levels))
                                                  for (b, m), by in cells.items()])]


def test_time(store: Store) -> list[str]:
    """How long ``make test`` took (``bench.test_time``): the install on a fresh clone, then each pytest phase."""
    data = need(store, "test_time")
    rows = {r["figure"]: r for r in summary_of(data) or []}
    m = data.get("machine") or {}

    def seconds(prefix: str) -> str:
        hit = [r for name, r in rows.items() if name.startswith(prefix)]
        if not hit:
            raise FigureError(f"docs/benchmarks/test_time.json has no figure starting {prefix!r}")
        return keep(f"{num_text(hit[0]['value'])} s")

    phases = data["phases"]
    where = "a fresh clone" if data["config"].get("fresh_clone") else "a checkout already set up"
    install = (f"after {seconds('install')} of install (`make setup` with an empty pip cache, the apt packages "
               "already present), "
               if data["config"].get("fresh_clone") else "")

    def count(key: str) -> int:
        return sum(int(p[key]) for p in phases.values())

    names = {"verl": "veRL", "areal": "AReaL", "vllm": "vLLM", "openenv": "OpenEnv"}
    ran = [names[n] for n in names if n in phases]
    frameworks = " and ".join([", ".join(ran[:-1]), ran[-1]] if len(ran) > 1 else ran)

    return [f"On {m.get('cores')} cores ({m.get('cpu_model') or 'an unknown CPU'}) `make test` took "
            f"{seconds('make test')} on {where} of code {m.get('git_revision') or 'of an unknown revision'}, "
            f"{install}with {count('passed'):,} tests passed, {count('failed')} failed and {count('skipped')} "
            f"skipped: first {seconds('first the veRL')} for the {frameworks} tests in their own environments (at "
            f"once, beside the type check), then {seconds('the tests in')} for the tests in "
            f"{data['config']['procs']} pytest processes, then {seconds('then the timing')} for the "
            f"{phases['wallclock']['tests']} timing tests alone "
            "([docs/benchmarks/test_time.json](docs/benchmarks/test_time.json), `python -m bench.test_time`)."]


_BUCKET_NAMES = {"input": "input", "script": "script", "style_layout": "style and layout", "paint": "paint",
                 "raster": "raster", "compositing": "compositing (the frame drawn)",
                 "screenshot": "screenshot (copy and JPEG)", "ipc": "IPC", "other": "other"}
_PROCESS_NAMES = ("browser", "renderer", "gpu", "network", "utility")


def chromium_cpu(store: Store) -> list[str]:
    """Where Chromium's CPU goes per step (``bench.chromium_cpu trace``) and what its variants cost
    (``bench.chromium_cpu ab``)."""
    d = need(store, "chromium_cpu_trace")
    loads = d["workloads"]
    lines = ["Chromium's CPU per step (ms) by process type, and by what the trace says it did "
             "([docs/benchmarks/chromium_cpu_trace.json](docs/benchmarks/chromium_cpu_trace.json), "
             "`python -m bench.chromium_cpu trace`):", "",
             "| workload | steps/s | Chromium | " + " | ".join(_PROCESS_NAMES) + " |",
             "|---" * (3 + len(_PROCESS_NAMES)) + "|"]
    for w in loads.values():
        cpu = w["cpu_ms_per_step"]
        lines.append(f"| {w['label']} | {num_text(w['steps_per_s'])} | {num_text(cpu['total'])} | "
                     + " | ".join(num_text(cpu.get(p, 0.0)) for p in _PROCESS_NAMES) + " |")
    lines += ["", "| workload | " + " | ".join(_BUCKET_NAMES.values()) + " |",
              "|---" * (1 + len(_BUCKET_NAMES)) + "|"]
    for name, w in loads.items():
        buckets = w["ms_per_step_by_bucket"]
        lines.append(f"| {name} | " + " | ".join(num_text(buckets.get(b, 0.0)) for b in _BUCKET_NAMES) + " |")
    ab = store.get("chromium_cpu_ab")
    if ab:
        lines += ["", "Variants against the workers' Chromium, same run, rounds alternating "
                  "([docs/benchmarks/chromium_cpu_ab.json](docs/benchmarks/chromium_cpu_ab.json), "
                  "`python -m bench.chromium_cpu ab`; below 1 cuts Chromium's CPU):", "",
                  "| variant | CPU per click + screenshot | CPU per page load | what it costs pages |",
                  "|---|---|---|---|"]
        for name, per in ab["over_default"].items():
            if name == "default":
                continue
            lines.append(f"| {name} | {num_text(per['light_clicks'])}x | {num_text(per['light_loads'])}x | "
                         f"{ab['variants'][name]['cost']} |")
        for name, why in ab.get("failed", {}).items():
            lines.append(f"| {name} | failed | failed | {ab['variants'][name]['cost']}; it failed: {why} |")
    return lines


def observe_cost(store: Store) -> list[str]:
    """What the accessibility tree and the DOM snapshot add per observation (``bench.observe_cost``)."""
    d = need(store, "observe_cost")
    lines = ["Per observation, with and without the tree and the DOM snapshot, same run "
             "([docs/benchmarks/observe_cost.json](docs/benchmarks/observe_cost.json), `python -m bench.observe_cost`; "
             f"{d['config']['sessions']} sessions on one worker, medians of {d['config']['rounds']} rounds):", "",
             "| page | observes | Chromium CPU (ms) | engine CPU (ms) | latency (ms) | observations/s | size |",
             "|---|---|---|---|---|---|---|"]
    for page, s in d["summary_by_page"].items():
        for mode in ("screenshot", "screenshot+dom", "screenshot+axtree", "screenshot+axtree+dom"):
            m = s[mode]
            sizes = [f"{num_text(m['nodes']['median'])} nodes, {num_text(m['chars']['median'])} characters"
                     ] if "nodes" in m else []
            sizes += [f"{num_text(m['elements']['median'])} elements"] if "elements" in m else []
            tree = ", ".join(sizes)
            lines.append(f"| {page} ({d['config']['pages'][page]}) | {mode} | {num_text(m['chromium_ms']['median'])} | "
                         f"{num_text(m['engine_ms']['median'])} | {num_text(m['latency_ms']['median'])} | "
                         f"{num_text(m['per_s']['median'])} | {tree} |")
    return lines


BLOCKS: dict[str, Callable[[Store], list[str]]] = {
    "chromium-cpu": chromium_cpu,
    "observe-cost": observe_cost,
    "headline": headline,
    "at-a-glance": at_a_glance,
    "suite-goals": suite_goals,
    "async-levels": async_levels,
    "async-live-levels": lambda store: async_levels(store, "async_live"),
    "async-prediction": async_prediction,
    "env-api": env_api,
    "rl-loop": rl_loop,
    "grpo-demo": grpo_demo,
    "request-rules": request_rules,
    "traffic-replay": traffic_replay,
    "omnibox": omnibox,
    "test-time": test_time,
}


def block_names() -> list[str]:
    """The block names a page may use (besides ``summary:STEM``)."""
    return sorted(BLOCKS)


WIDTH = 115  # the README's source lines
# A word that Markdown would read as block syntax at the start of a line (a quote, a list item, a heading, ...).
_BLOCK_START = re.compile(r"(>.*|[-+*]|#{1,6}|=+|\|.*|\d{1,9}[.)])")


def wrap(line: str, width: int = WIDTH) -> str:
    """A paragraph or a list item as source lines of at most ``width`` characters (a longer word stays whole), never
    starting a line with a word that Markdown would read as block syntax. A table row stays one line (Markdown
    reads a row only from one)."""
    if line.startswith("|"):
        return line.replace(_NBSP, " ")
    indent = "  " if line.startswith("- ") else ""
    units: list[str] = []
    for word in line.split(" "):
        if units and (not word or _BLOCK_START.fullmatch(word)):
            units[-1] += " " + word  # keeps it off the start of a line
        else:
            units.append(word)
    out, cur = [], ""
    for unit in units:
        if cur and len(cur) + 1 + len(unit) > width:
            out.append(cur)
            cur = indent + unit
        else:
            cur = f"{cur} {unit}" if cur else unit
    return "\n".join([*out, cur]).replace(_NBSP, " ")


def render_block(name: str, store: Store) -> str:
    """The Markdown between ``<!-- figures: NAME -->`` and ``<!-- /figures -->`` (ends with a newline)."""
    if name.startswith("summary:"):
        lines = summary_block(store, name.partition(":")[2])
    elif name in BLOCKS:
        lines = read_with(BLOCKS[name], store, "")
    else:
        raise FigureError(f"no figure block named {name!r} (known: {', '.join(block_names())}, summary:STEM)")
    return "\n".join(wrap(line) for line in lines) + "\n"
