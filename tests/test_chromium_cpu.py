"""The trace breakdown of ``bench/chromium_cpu.py``: each complete event's self thread-time in one bucket, by process
type, on a hand-made trace (the benchmark itself needs a quiet machine; its figures are stored results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.chromium_cpu import bucket_of, scaled_breakdown, trace_breakdown


def event(pid: int, name: str, tts_ms: float, tdur_ms: float, cat: str = "toplevel", **args: str) -> dict:
    """A complete event; a trace counts microseconds."""
    return {"ph": "X", "pid": pid, "tid": 1, "name": name, "cat": cat, "ts": tts_ms * 1000, "tts": tts_ms * 1000,
            "dur": tdur_ms * 1000, "tdur": tdur_ms * 1000, "args": args}


def test_self_time_goes_to_each_events_bucket_and_an_uninformative_child_to_its_parents(tmp_path: Path) -> None:
    events = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "Renderer"}},
        {"ph": "M", "pid": 2, "tid": 0, "name": "process_name", "args": {"name": "GPU Process"}},
        # A renderer task of 10 ms: 3 of layout and 2 of script inside it, 1 of an unnamed helper in the script.
        event(1, "ThreadControllerImpl::RunTask", 0, 10, src_func="PostTask"),
        event(1, "UpdateLayoutTree", 2, 3, cat="blink"),
        event(1, "v8.run", 6, 2, cat="v8"),
        event(1, "SomeHelper", 6.5, 1, cat="x"),
        # The GPU process: a draw, and the capture's copy posted from the copy request's code.
        event(2, "SoftwareRenderer::DoDrawQuad", 20, 4, cat="viz"),
        event(2, "ThreadPool_RunTask", 30, 6, src_file="components/viz/common/frame_sinks/copy_output_request.cc"),
        {"ph": "B", "pid": 2, "tid": 1, "name": "no thread time", "ts": 40_000},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = trace_breakdown([str(path)])
    assert got["renderer"] == pytest.approx({"other": 0.005, "style_layout": 0.003, "script": 0.002})
    assert got["gpu"] == pytest.approx({"compositing": 0.004, "screenshot": 0.006})


def test_buckets_by_name_category_and_posting_code() -> None:
    assert bucket_of("input", "InputRouterImpl::MouseEventHandled", {}) == "input"
    assert bucket_of("toplevel", "ThreadControllerImpl::RunTask",
                     {"src_file": "services/viz/public/cpp/compositing/copy_output_request_mojom_traits.cc",
                      "src_func": "SendResult"}) == "screenshot"
    assert bucket_of("mojom", "Receive mojo message", {}) == "ipc"
    assert bucket_of("blink", "Paint", {}) == "paint"
    assert bucket_of("toplevel", "ThreadControllerImpl::RunTask", {"src_func": "Unrelated"}) == "other"


def test_the_traced_shares_scale_to_the_untraced_cpu() -> None:
    scaled = scaled_breakdown({"renderer": 10.0, "gpu": 4.0, "total": 14.0},
                              {"renderer": {"script": 0.3, "paint": 0.1}})
    assert scaled == {"renderer": {"script": 7.5, "paint": 2.5}, "gpu": {"untraced": 4.0}}
