"""The engine-alone benchmarks on a small scale: null workers (the benchmark stand-ins of bench/null_worker.py)
speak the worker protocol well enough for the engine to run real plans on them, and the soak's audit and the
scale level's figures come out of such a run. The figures themselves are not asserted: they are benchmarks."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvloop

from bench import engine_scale, soak


def test_a_scale_level_steps_every_rollout_on_null_workers(tmp_path: Path) -> None:
    row = uvloop.run(engine_scale.level(16, "protocol", workers=1, seconds=1.0, steps_per_episode=3,
                                        run_root=str(tmp_path)))
    assert row["errors"] == 0 and row["steps"] > 0 and row["steps_per_s"] > 0
    assert row["gc_share_of_loop"] >= 0 and len(row["gc_collections"]) == 3
    assert not list(tmp_path.iterdir())  # the run directory is removed


def test_a_null_worker_soak_records_every_episode_once(tmp_path: Path) -> None:
    args = argparse.Namespace(episodes=120, concurrency=8, workers=1, policy="instant", step_caps=(1, 1, 1),
                              keep_task_caps=False, sample_s=0.5, warmup=None, run_root=str(tmp_path),
                              null_workers=True)
    res = uvloop.run(soak.soak(args))
    audit = res["audit"]
    assert audit["exactly_one_each"] and audit["records"] == audit["planned"] == 120 and not res["interrupted"], audit
    assert res["samples"][-1]["episodes"] == 120 and res["figures"]["engine"]["end_mib"] > 0
    assert not list(tmp_path.iterdir())  # the run directory is removed
