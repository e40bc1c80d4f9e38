"""The RL loop end to end on CPU: rollouts of a tiny Qwen-VL through the engine, programmatic rewards, a GRPO
update, the new weights loaded in place, and every step's policy version kept.

The tasks' check is a coin flip evaluated in the final page (``Math.random() < 0.5``): a random tiny model
cannot solve anything, and GRPO needs reward variance within a group to make an update. The plumbing (the
rollouts, the rewards, the samples, the update, the versions) is what is tested, not learning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from bench.rl_loop import COIN_TASKS  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402


def weights(path: Path) -> dict:
    out: dict = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def loop_config(tmp_path: Path, mode: str) -> Path:
    model = build_tiny_model(tmp_path / "model", "qwen3_vl", hidden_size=64, num_layers=2)
    tasks = tmp_path / "coin.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in COIN_TASKS) + "\n")
    config = tmp_path / "loop.toml"
    config.write_text(f"""
tasks = "{tasks}"
iterations = 2
mode = "{mode}"
samples_per_task = 4
concurrency = 16
workers = 1
device = "cpu"
max_tokens = 8
step_caps = [2, 2, 2]  # short episodes: the plumbing is tested, not how far a random model wanders
output_dir = "{tmp_path / 'rl'}"

[train]
model_dir = "{model}"
algorithm = "grpo"
lr = 1e-3
max_steps = 1
batch_size = 8
cpu_threads = 1
progress = false
tensorboard = false
plots = false

[train.agent]
response_format = "vanilla"
window = 1
""")
    return config


def test_grpo_iterations_update_the_weights_and_keep_versions(tmp_path: Path) -> None:
    # The synchronous loop is tested against a served policy (tests/test_served_policy.py); this is the in-process
    # backend from the command line, in async mode, where the weights change under running episodes.
    config = loop_config(tmp_path, "async")
    proc = subprocess.run([sys.executable, "-m", "cli.main", "train", str(config)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in (tmp_path / "rl" / "loop.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in reports] == [0, 1]
    first, second = reports
    assert first["episodes"] == second["episodes"] == 16 and first["versions_seen"] == [0]
    assert first["samples"] > 0 and first["version"] == 1 and first["checkpoint"], first
    # The second batch started before the update, so its early steps come from version 0 and, once the weights
    # were swapped mid-episode, its later ones from version 1; one version behind is within the staleness bound.
    assert second["versions_seen"][0] == 0 and set(second["versions_seen"]) <= {0, 1}
    assert second["stale_dropped"] == 0
    before, after = weights(tmp_path / "model"), weights(Path(first["checkpoint"]))
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert len(changed) > len(before) // 2  # one GRPO step moved most tensors
    [run_dir] = (tmp_path / "rl" / "rollouts").iterdir()
    records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 32 and all(s["policy_version"] in (0, 1) for r in records for s in r["steps"])
    assert all(s["token_ids"] and len(s["token_ids"]) == len(s["logprobs"]) for r in records for s in r["steps"])
