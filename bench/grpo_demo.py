"""Store the GRPO demonstration's result: ``python -m bench.grpo_demo [--out docs/benchmarks]``.

Runs :func:`train.examples.grpo_demo.run_demo` (the full configuration: a behaviour-cloning warm start of a tiny
Qwen-VL on a careless demonstrator's runs, then GRPO, a shuffled-reward control and the ``1/|tau|`` normaliser
through the RL loop, each evaluated on held-out colour boards before and after) and writes ``grpo_demo.json``
(the ``summary`` rows: S0, S1, the gain with its 95% interval, the control's gain, the normalisers' success and
episode lengths, the wall time) with ``grpo_demo.png`` (held-out success before and after each run, and each
iteration's rollout success) beside it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import row, write_result
from train.examples.grpo_demo import DemoConfig, DemoResult, run_demo

TITLE = "GRPO through the engine (CPU demonstration)"
MIN_GAIN = 0.30  # the goal: S1 - S0 of the GRPO run
MAX_MINUTES = 15.0  # on 2 cores


def repeat_brief(result: DemoResult, wall_s: float) -> dict[str, Any]:
    """One repeat's figures: each run's S0, S1, gain with its interval and mean episode length, and the wall time."""
    return {"wall_s": round(wall_s, 1), "validation": result.warm_start["validation"],
            "runs": {name: {"s0": run.start["success_rate"], "s1": run.end["success_rate"], "gain": run.gain["gain"],
                            "interval_95": run.gain["interval_95"], "mean_steps": run.end["mean_steps"]}
                     for name, run in result.runs.items()}}


def repeat_rows(repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spread over repeated demonstrations (each from its own warm start): the GRPO gain's lowest and highest,
    the runs whose interval excluded 0, the control's highest gain and the runs where it did not rise."""
    n = len(repeats)
    gains = [r["runs"]["grpo"]["gain"] for r in repeats]
    excluded = sum(r["runs"]["grpo"]["interval_95"][0] > 0 for r in repeats)
    rows = [row("repeats of the whole demonstration", n, "runs"),
            row("gain S1 - S0 (1/k), lowest over the repeats", min(gains), "", f">= {MIN_GAIN:.2f}",
                min(gains) >= MIN_GAIN),
            row("gain S1 - S0 (1/k), highest over the repeats", max(gains), ""),
            row("repeats whose gain interval excludes 0", excluded, "runs", f"= {n}", excluded == n)]
    if all("control" in r["runs"] for r in repeats):
        control = [r["runs"]["control"] for r in repeats]
        still = sum(c["interval_95"][0] <= 0 for c in control)
        rows += [row("control's gain, highest over the repeats", max(c["gain"] for c in control), ""),
                 row("repeats whose control did not rise (its interval's low end <= 0)", still, "runs", f"= {n}",
                     still == n)]
    return rows


def summary_rows(result: DemoResult, wall_s: float) -> list[dict[str, Any]]:
    """The headline rows: the GRPO run's S0, S1 and gain (with its interval), the control's, the ``1/|tau|`` run's,
    the mean episode lengths and the wall time."""
    runs = result.runs
    grpo = runs["grpo"]
    low, high = grpo.gain["interval_95"]
    rows = [
        row("S0: held-out success after the warm start", 100 * grpo.start["success_rate"], "%"),
        row("S1: held-out success after GRPO (1/k)", 100 * grpo.end["success_rate"], "%"),
        row("gain S1 - S0 (1/k)", grpo.gain["gain"], "", f">= {MIN_GAIN:.2f}", grpo.gain["gain"] >= MIN_GAIN),
        row("gain S1 - S0 (1/k): 95% interval, low end", low, "", "> 0", low > 0),
        row("gain S1 - S0 (1/k): 95% interval, high end", high, ""),
        row("boards the gain rests on", grpo.gain["tasks"], "boards"),
        row("episodes the gain rests on", grpo.gain["episodes"], "episodes"),
    ]
    if "control" in runs:
        control = runs["control"]
        c_low, _ = control.gain["interval_95"]
        rows += [row("control S1 (rewards shuffled in each group)", 100 * control.end["success_rate"], "%"),
                 row("control's gain S1 - S0", control.gain["gain"], "", "no rise: 95% interval's low end <= 0",
                     c_low <= 0)]
        if "grpo" in result.versus_control:
            v = result.versus_control["grpo"]
            rows.append(row("S1 (1/k) - control S1, paired: 95% interval, low end", v["interval_95"][0], "", "> 0",
                            v["interval_95"][0] > 0))
    if "tau" in runs:
        tau = runs["tau"]
        rows += [row("S1 with the 1/|tau| normaliser", 100 * tau.end["success_rate"], "%"),
                 row("gain S1 - S0 (1/|tau|)", tau.gain["gain"], ""),
                 row("mean episode length after GRPO (1/k)", grpo.end["mean_steps"], "steps"),
                 row("mean episode length after GRPO (1/|tau|)", tau.end["mean_steps"], "steps")]
    rows.append(row("wall time of the whole demonstration (the longest repeat)", wall_s / 60, "min",
                    f"<= {MAX_MINUTES:g} min on 2 cores",
                    wall_s / 60 <= MAX_MINUTES))
    return rows


def plot(path: Path, result: DemoResult) -> Path:
    """Left: held-out success before and after each run (95% intervals). Right: each iteration's rollout success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"grpo": "GRPO (1/k)", "control": "control (shuffled rewards)", "tau": "GRPO (1/|tau|)"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, run) in enumerate(result.runs.items()):
        for j, (when, ev) in enumerate((("S0", run.start), ("S1", run.end))):
            rate, (low, high) = ev["success_rate"], ev["interval_95"]
            left.bar(i * 3 + j, 100 * rate, color="tab:gray" if when == "S0" else "tab:blue",
                     yerr=[[100 * max(0.0, rate - low)], [100 * max(0.0, high - rate)]], capsize=4)
        right.plot([it["iteration"] for it in run.iterations], [100 * it["success_rate"] for it in run.iterations],
                   marker="o", label=labels.get(name, name))
    left.set_xticks([i * 3 + 0.5 for i in range(len(result.runs))], [labels.get(n, n) for n in result.runs],
                    fontsize=8)
    left.set_ylabel("held-out success (%)")
    left.set_title("held-out boards: S0 (grey) and S1 (blue)")
    right.set_xlabel("iteration")
    right.set_ylabel("rollout success (%)")
    right.set_title("training rollouts")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def notes(result: DemoResult) -> list[str]:
    cfg = result.config
    warm = result.warm_start
    v = warm["validation"]
    return [
        f"Task family: the colour board (train/examples/colour_board.py), 'Click the red square, then Submit.', "
        f"{cfg.demo_boards} demonstration, {cfg.validation_boards} validation, {cfg.train_boards} training and "
        f"{cfg.heldout_boards} held-out layouts, no layout in two sets.",
        f"Model: a tiny random {cfg.arch} ({cfg.hidden_size} hidden, {cfg.layers} layers) built offline.",
        f"Warm start: behaviour cloning on a careless demonstrator's steps (it picks the red square every time, then "
        f"answers instead of pressing Submit in {cfg.careless:.0%} of its attempts): {warm['pick_steps']} steps on "
        f"the picks, then {warm['settle_steps']} on every step; on the validation boards its greedy first click then "
        f"picked the red square on {v['accuracy']:.0%} of them, its sampled finish submitted on {v['submit']:.0%}.",
        f"GRPO: the RL loop in async mode, the stand-in for vLLM (policy.served_stand_in) serving over HTTP, "
        f"new weights pushed after every update, staleness {cfg.staleness}, decoupled PPO; {cfg.iterations} iterations "
        f"of {cfg.groups_per_iteration} groups of {cfg.group_size} on the training boards, lr {cfg.lr:g}; the three "
        f"runs start from the same checkpoint with the same seeds and budget.",
        "S0 and S1: one episode per held-out board at the rollouts' temperature (1.0), before the first update and "
        "after the last; the gain's interval is the mean of the per-board differences +-1.96 standard errors.",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--work", type=Path, default=None, help="keep the work directories here (default: temporary)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the whole demonstration this many times; the first is stored in full, every one's "
                         "figures in `repeats` with their spread in the summary")
    args = ap.parse_args(argv)
    cfg = DemoConfig()
    runs: list[tuple[DemoResult, float]] = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="grpo-demo-") as tmp:
            t0 = time.monotonic()
            result = run_demo(args.work / f"repeat-{i}" if args.work else Path(tmp), cfg)
            runs.append((result, time.monotonic() - t0))
        print(f"repeat {i + 1}/{args.repeats}:\n{result.report()}", flush=True)
    result, wall = runs[0]
    repeats = [repeat_brief(r, w) for r, w in runs]
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(args.out / "grpo_demo.png", result)
    rows = summary_rows(result, max(w for _, w in runs)) + (repeat_rows(repeats) if len(runs) > 1 else [])
    data = result.to_dict()
    write_result(args.out / "grpo_demo.json", "grpo_demo", data.pop("config"), rows, [png.name], notes(result),
                 title=TITLE, wall_s=round(wall, 1), repeats=repeats, **data)
    for r in rows:
        met = "" if r["met"] is None else ("  met" if r["met"] else "  MISSED")
        print(f"{r['figure']:64s} {r['value']:>10,.3f} {r['unit']}{met}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
