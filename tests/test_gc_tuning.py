"""The collector's settings for an engine process: applied in a process of its own (they are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_an_engine_process_freezes_its_start_up_heap_and_still_collects_cycles() -> None:
    code = textwrap.dedent("""
        import gc, json, weakref
        import engine.core.core  # what an engine process has imported when it tunes
        from engine.core.gc_tuning import THRESHOLDS, tune_for_engine_process

        tune_for_engine_process()
        frozen = gc.get_freeze_count()

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        alive = [[None] for _ in range(THRESHOLDS[0] * 3)]  # objects enough for young collections
        print(json.dumps({"thresholds": gc.get_threshold(), "frozen": frozen, "cycle_freed": gone() is None}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    res = json.loads(out.stdout)
    assert res["thresholds"] == [20_000, 20, 20]
    assert res["frozen"] > 10_000  # the modules, classes and functions imported so far
    assert res["cycle_freed"]
