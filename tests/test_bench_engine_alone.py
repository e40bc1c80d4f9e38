"""The engine-alone benchmarks on a small scale: null workers (the benchmark stand-ins of bench/null_worker.py)
speak the worker protocol well enough for the engine to run real plans on them, and the soak's audit and the
scale level's figures come out of such a run. The figures themselves are not asserted: they are benchmarks."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import uvloop

from bench import engine_scale, render, soak, tmpfs_writes


def test_a_scale_level_steps_every_rollout_on_null_workers(tmp_path: Path) -> None:
    row = uvloop.run(engine_scale.level(16, "protocol", workers=1, seconds=1.0, steps_per_episode=3,
                                        run_root=str(tmp_path)))
    assert row["errors"] == 0 and row["steps"] > 0 and row["steps_per_s"] > 0
    assert "gc_share_of_loop" in row
    assert row["inline_frames"] == 0  # every frame came through the rings: they have room for two per rollout
    assert not list(tmp_path.iterdir())  # the run directory is removed


def test_frames_come_inline_when_a_workers_ring_is_full_and_every_step_still_completes(tmp_path: Path) -> None:
    row = uvloop.run(engine_scale.level(16, "instant", workers=1, seconds=1.0, steps_per_episode=3,
                                        run_root=str(tmp_path), ring_slots=4))
    assert row["errors"] == 0 and row["steps"] > 0
    assert row["inline_frames"] > 0  # 16 rollouts, 4 slots: the pool counts what came through the socket


def test_the_gc_meter_counts_a_full_collection() -> None:
    with engine_scale.GcMeter() as meter:
        gc.collect()
    assert meter.count[2] == 1 and meter.seconds[2] > 0
    assert meter not in gc.callbacks


def test_a_null_worker_soak_records_every_episode_once(tmp_path: Path) -> None:
    args = soak.build_parser().parse_args(["--episodes", "120", "--concurrency", "8", "--workers", "1",
                                           "--sample-s", "0.5", "--run-root", str(tmp_path), "--null-workers"])
    res = uvloop.run(soak.soak(args))
    audit = res["audit"]
    assert audit["exactly_one_each"] and audit["records"] == audit["planned"] == 120 and not res["interrupted"], audit
    assert res["samples"][-1]["episodes"] == 120 and res["figures"]["engine"]["end_mib"] > 0
    assert not list(tmp_path.iterdir())  # the run directory is removed


def test_the_tmpfs_write_probe_writes_three_passes_and_leaves_nothing(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "tmpfs_writes.json"
    root.mkdir()
    tmpfs_writes.main(["--gib", "0.02", "--window-gib", "0.005", "--root", str(root), "--json", str(out)])
    data = json.loads(out.read_text())
    assert [p["pass"] for p in data["passes"]] == ["fill", "window", "fill again"]
    for p in data["passes"]:
        [row] = p["rows"]  # less than a GiB: one chunk
        assert row["gib_written"] == 0.02 and row["cpu_us_per_file"] > 0 and row["wall_us_per_file"] > 0
    assert not list(root.iterdir())  # every file and folder removed
    lines = render.tmpfs_writes(data)
    assert "| GiB written | fill | window | fill again |" in lines
