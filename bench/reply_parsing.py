"""How long reading a reply takes, per action format: p50 and p99 over a corpus of generated replies.

Parsing runs on the engine's event loop, once per step of every rollout, so its cost is paid hundreds of times a
second at scale. The corpus (``--replies`` per format, seeded) mixes what models write: well-formed replies with a
thought of 20-200 words, replies without a thought, boxes instead of points, several actions, points off the
screen, replies cut mid-call, and a few long ones (a thought of several thousand words). Each format's replies
carry the same actions, written in its own grammar.

    python -m bench.reply_parsing [--replies 10000] [--json docs/benchmarks/reply_parsing.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.agent.coords import CoordFrame
from engine.agent.formats import FORMATS

WORDS = ("the", "search", "box", "results", "page", "click", "button", "cart", "price", "cheapest", "open", "next",
         "product", "list", "filter", "sort", "by", "rating", "review", "menu", "top", "left", "right", "scroll",
         "down", "see", "more", "then", "answer", "total")
FRAME = CoordFrame.pixels(1280, 768, factor=28, min_pixels=3136, max_pixels=12845056)


def _thought(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _action(rng: random.Random) -> dict[str, Any]:
    kind = rng.choices(["click", "type", "scroll", "answer", "box", "offscreen"], [40, 20, 15, 10, 10, 5])[0]
    x, y = rng.randint(0, 1288), rng.randint(0, 756)
    if kind == "offscreen":
        x += 2000
    return {"kind": kind, "x": x, "y": y, "text": _thought(rng, rng.randint(1, 4))}


def qwen(a: dict[str, Any]) -> str:
    args: dict[str, Any] = {"click": {"action": "left_click", "coordinate": [a["x"], a["y"]]},
                            "offscreen": {"action": "left_click", "coordinate": [a["x"], a["y"]]},
                            "box": {"action": "left_click", "coordinate": [a["x"], a["y"], a["x"] + 40, a["y"] + 20]},
                            "type": {"action": "type", "coordinate": [a["x"], a["y"]], "text": a["text"]},
                            "scroll": {"action": "scroll", "direction": "down"},
                            "answer": {"action": "answer", "text": a["text"]}}[a["kind"]]
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"


def uitars(a: dict[str, Any]) -> str:
    x, y, text = a["x"], a["y"], a["text"].replace("'", "\\'")
    return "Action: " + {"click": f"click(start_box='<|box_start|>({x},{y})<|box_end|>')",
                         "offscreen": f"click(start_box='({x},{y})')",
                         "box": f"click(start_box='({x},{y},{x + 40},{y + 20})')",
                         "type": f"type(content='{text}\\n')", "scroll": f"scroll(start_box='({x},{y})', "
                                                                         "direction='down')",
                         "answer": f"finished(content='{text}')"}[a["kind"]]


def pyautogui(a: dict[str, Any]) -> str:
    x, y, text = a["x"], a["y"], a["text"].replace("'", "\\'")
    call = {"click": f"pyautogui.click({x}, {y})", "offscreen": f"pyautogui.click({x}, {y})",
            "box": f"pyautogui.click(x={x}, y={y})", "type": f"pyautogui.write('{text}\\n')",
            "scroll": "pyautogui.scroll(-5)", "answer": f"answer('{text}')"}[a["kind"]]
    return f"```python\n{call}\n```"


WRITERS: dict[str, Callable[[dict[str, Any]], str]] = {"qwen": qwen, "uitars": uitars, "pyautogui": pyautogui}
THOUGHT_PREFIX = {"qwen": "Action: ", "uitars": "Thought: ", "pyautogui": ""}


def corpus(fmt: str, n: int, seed: int = 0) -> list[str]:
    """``n`` replies in ``fmt``: the same actions and thoughts for every format (one seed)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        shape = rng.choices(["plain", "no_thought", "several", "truncated", "long"], [70, 10, 10, 7, 3])[0]
        words = rng.randint(2000, 5000) if shape == "long" else rng.randint(20, 200)
        thought = "" if shape == "no_thought" else THOUGHT_PREFIX[fmt] + _thought(rng, words) + "\n"
        calls = [WRITERS[fmt](_action(rng)) for _ in range(3 if shape == "several" else 1)]
        if fmt == "uitars" and len(calls) > 1:  # one Action: line, the calls below it
            calls = [calls[0]] + [c.removeprefix("Action: ") for c in calls[1:]]
        reply = thought + "\n\n".join(calls)
        out.append(reply[:int(len(reply) * rng.uniform(0.5, 0.95))] if shape == "truncated" else reply)
    return out


def measure(fmt: str, replies: list[str]) -> dict[str, Any]:
    """Parse time per reply (µs): p50, p99, max; and the share of replies that gave an action."""
    reader = FORMATS[fmt]
    times, actions = [], 0
    for text in replies:
        t0 = time.perf_counter()
        action, _ = reader.read(text, FRAME)
        times.append((time.perf_counter() - t0) * 1e6)
        actions += action.name != "wait"
    times.sort()
    return {"format": fmt, "replies": len(replies), "mean_chars": round(statistics.mean(map(len, replies))),
            "p50_us": round(times[len(times) // 2], 1), "p99_us": round(times[int(len(times) * 0.99)], 1),
            "max_us": round(times[-1], 1), "actions_share": round(actions / len(replies), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replies", type=int, default=10_000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for fmt in FORMATS:
        replies = corpus(fmt, args.replies)
        measure(fmt, replies[:200])  # warm caches and the regex engine
        rows.append(measure(fmt, replies))
        r = rows[-1]
        print(f"{fmt:10s} {r['replies']} replies, {r['mean_chars']} chars on average: p50 {r['p50_us']:.0f} µs, "
              f"p99 {r['p99_us']:.0f} µs, max {r['max_us']:.0f} µs; {100 * r['actions_share']:.0f}% gave an action",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "reply_parsing", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
