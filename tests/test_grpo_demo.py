"""GRPO through the engine, with vLLM itself serving the policy, makes a policy better, and a control with shuffled
rewards does not.

The smaller version of ``python -m train.examples.grpo_demo`` (:meth:`DemoConfig.quick`): a tiny Qwen3-VL built
offline, a behaviour-cloning warm start on a careless demonstrator's runs of the colour board (it picks the red
square, then often answers instead of pressing Submit; in this version the red square always stands in the first
cell, so that the pick is learnt at once; episodes have two steps, the pick and the finish), then the RL loop twice
from that checkpoint, in async mode, the policy served by vLLM (its CPU build, ``.venv-vllm``: docs/vllm-cpu.md)
and every update pushed into it by ``reload_weights``: GRPO, and GRPO on rewards shuffled inside each group. Each
run pushes the warm start into the server first and is evaluated on held-out boards before and after. Real parts
throughout: vLLM, Chromium through the engine's workers, the bundled site's board page and its own reward, the
trainer, the loop. The server starts while the demonstrations and the warm start run.

The server comes from ``.venv-vllm``, which ``make test`` builds in its first phase; this file runs in the second,
among the suite's tests (their longest).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.vllm_cpu import starting_vllm  # noqa: E402
from engine.store.run_dir import read_records  # noqa: E402
from train.examples.grpo_demo import DemoConfig, build_model, run_demo  # noqa: E402

# An allowance: the server starts beside the other tests of make test's first phase.
START_TIMEOUT_S = 600


def _get(base_url: str, route: str) -> str:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + route, timeout=30) as reply:
        return str(reply.read().decode())


def _finished_requests(metrics: str) -> float:
    """vLLM's count of finished requests (every finish reason), from its Prometheus metrics."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:request_success_total"))


# Two RL runs with a model on the CPU and a vLLM server beside them (its time: docs/benchmarks/test_time.json):
# past the suite's default per-test cap (a guard against hangs, pyproject.toml).
@pytest.mark.timeout(1500)
def test_grpo_served_by_vllm_raises_held_out_success_above_a_shuffled_reward_control(tmp_path: Path) -> None:
    cfg = DemoConfig.quick()
    with starting_vllm(build_model(cfg, tmp_path / "served"), tmp_path / "vllm.log") as server:
        result = run_demo(tmp_path / "demo", cfg, vllm=lambda: server.ready(START_TIMEOUT_S).base_url)
        weight_info = json.loads(_get(server.base_url, "/weight_info"))
        finished = _finished_requests(_get(server.base_url, "/metrics"))
    print(result.report())  # the figures, in the test's log
    warm = result.warm_start["validation"]
    assert warm["accuracy"] >= 0.9  # the warm start picks the red square ...
    assert warm["submit"] <= 0.6  # ... and then often stops short of Submit: room to learn
    grpo, control = result.runs["grpo"], result.runs["control"]
    # S0 is the warm start's (pushed into the server before the first rollout), not the random model's.
    assert 0.05 <= grpo.start["success_rate"] <= 0.6, grpo.start
    # GRPO: the held-out success rises, with a 95% interval that excludes 0. Measured with the stand-in on 48
    # held-out boards under the suite's load, ten runs: gains +0.17 to +0.69 (one of them collapsed to -0.02: a
    # last update that broke the tiny model's reply format).
    assert grpo.gain["gain"] >= 0.1 and grpo.gain["interval_95"][0] > 0, grpo.gain
    # The control (same checkpoint, seeds and budget; rewards shuffled in each group) ends below GRPO on the same
    # boards, by at least 0.2 and with a paired 95% interval that excludes 0: the reward made the gain. Not "the
    # control does not rise": its updates carry no reward signal but still move the policy, and zero-mean noise on
    # the logit of a one-in-three choice (Submit or not) raises its probability on average, so the control's success
    # can drift up, its interval clear of 0, while GRPO's ends far above it.
    versus = result.versus_control["grpo"]
    assert versus["gain"] >= 0.2 and versus["interval_95"][0] > 0, versus
    assert control.gain["gain"] < grpo.gain["gain"]
    # The loop pushed every update into vLLM and trained within the staleness bound.
    assert [it["version"] for it in grpo.iterations] == list(range(1, len(grpo.iterations) + 1))
    assert all(it["max_staleness"] <= 1 for it in grpo.iterations)
    assert all(it["excluded"] == 0 for it in grpo.iterations)
    # vLLM served them: it holds the control run's last version (an iteration without a sample to train on, every
    # group's rewards alike, pushes nothing), and it answered every recorded step.
    assert weight_info["weight_version"] == str(control.iterations[-1]["version"]), weight_info
    steps = sum(len(r.get("steps") or []) for run in ("grpo", "control")
                for rollouts in (tmp_path / "demo" / run / "rollouts").iterdir() if rollouts.is_dir()
                for r in read_records(rollouts))
    assert steps > 0 and finished >= steps, (finished, steps)
