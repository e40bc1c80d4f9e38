"""The RL loop with a served policy: weights pushed into running servers, versions recorded, staleness bounded.

:class:`tests.served_model_server.ServedModelTestServer` stands in for vLLM and SGLang here: the OpenAI protocol
over real HTTP around a tiny transformers model, with the real servers' weight-update endpoints (vLLM 0.32's
``reload_weights`` through ``/collective_rpc``, or its weight-transfer API where a server has the ``disk``
backend; SGLang's update_weights_from_disk), and vLLM's way of failing (a 500 that closes its connection).
The tasks' check is a coin flip, as in tests/test_rl_loop.py: GRPO needs reward variance, not a capable model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.rl_loop import COIN_TASKS  # noqa: E402
from engine.agent.model_api import ChatRequest, Generation, SamplingParams  # noqa: E402
from engine.agent.policy_api import PolicyError  # noqa: E402
from policy.hf_backend import HFModel  # noqa: E402
from policy.openai_backend import OpenAIModel  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from policy.weight_sync import WeightSync, server_sync  # noqa: E402
from tests.conftest import until  # noqa: E402
from tests.served_model_server import ServedModelTestServer  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.loop import run_loop
from train.loop_config import LoopConfig  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Qwen3-VL and the same model with other weights (a stand-in for a trained checkpoint)."""
    root = tmp_path_factory.mktemp("served")
    first = build_tiny_model(root / "model", "qwen3_vl", seed=0, hidden_size=64, num_layers=2)
    second = build_tiny_model(root / "trained", "qwen3_vl", seed=1, hidden_size=64, num_layers=2)
    return first, second


def chat(i: int, max_tokens: int = 8) -> ChatRequest:
    return ChatRequest(f"r{i}", [{"role": "user", "content": [{"type": "text", "text": f"hello {i}"}]}], {},
                       SamplingParams(temperature=0.0, max_tokens=max_tokens))


PUSHES = [("vllm", "abort", None), ("vllm", "wait", "disk"), ("sglang", "wait", None)]


@contextlib.asynccontextmanager
async def pushing(model: Path, flavor: str, mode: str, transfer: str | None
                  ) -> AsyncIterator[tuple[ServedModelTestServer, OpenAIModel, WeightSync]]:
    """A stand-in server of ``model``, a client of it and the push for it, started (``transfer``: vLLM's
    weight-transfer backend, None as in released vLLM)."""
    async with ServedModelTestServer(HFModel(str(model), device="cpu"), flavor, weight_transfer=transfer) as server:
        client = OpenAIModel(server.base_url, "policy", token_ids=flavor == "vllm", logprobs_of="model")
        sync = server_sync(flavor, [client], mode)  # type: ignore[arg-type]
        await client.start()
        try:
            await sync.start()
            yield server, client, sync
        finally:
            await sync.close()
            await client.close()


async def in_flight_at(server: ServedModelTestServer, n: int, mode: str) -> None:
    """Before a push: abort's ``n`` requests all generating at the server (a request still on its way when the
    server pauses is not aborted: under load, a fixed 0.1 s let one of four through); wait's, a moment to leave."""
    if mode == "abort":
        assert await until(lambda: server.generating == n, timeout_s=60), server.generating
    else:
        await asyncio.sleep(0.1)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize(("flavor", "mode", "transfer"), PUSHES)
async def test_push_changes_the_served_weights_and_labels_every_reply(models: tuple[Path, Path], flavor: str,
                                                                      mode: str, transfer: str | None) -> None:
    first, second = models
    async with pushing(first, flavor, mode, transfer) as (server, client, sync):
        before = await client.generate(chat(0))
        assert before.policy_version == 0
        # Requests in flight when the push begins: aborted and sent again (abort), or finished first (wait). An
        # aborted request answers at once, so abort's may take long: under load, 0.3 s let some finish before the
        # push began.
        server.generation_delay_s = 5.0 if mode == "abort" else 0.3
        in_flight = [asyncio.ensure_future(client.generate(chat(i))) for i in range(1, 5)]
        await in_flight_at(server, 4, mode)
        report = await sync.push(second, 1)
        server.generation_delay_s = 0.0
        replies = await asyncio.gather(*in_flight)
        after = await client.generate(chat(0))
    assert report.in_flight == 4 and server.weight_version == "1"
    assert server.updates == [(str(second), "1")]
    if mode == "abort":
        assert server.aborted == 4 and report.resent == 4 and client.resent == 4
        assert {r.policy_version for r in replies} == {1}  # answered by the new weights, and recorded so
    else:
        assert server.aborted == 0 and report.resent == 0
        assert {r.policy_version for r in replies} == {0}  # finished on the old weights, and recorded so
    assert after.policy_version == 1
    assert (after.text, after.logprobs) != (before.text, before.logprobs)  # the pushed weights answer now


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize(("flavor", "mode", "transfer"), PUSHES)
async def test_a_failed_push_leaves_the_server_resumed_and_records_nothing_under_its_version(
        tmp_path: Path, models: tuple[Path, Path], flavor: str, mode: str, transfer: str | None) -> None:
    first, second = models
    corrupt = tmp_path / "corrupt"  # a checkpoint whose weights file is cut short (a trainer killed mid-write)
    shutil.copytree(second, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    async with pushing(first, flavor, mode, transfer) as (server, client, sync):
        server.generation_delay_s = 5.0 if mode == "abort" else 0.3
        in_flight = [asyncio.ensure_future(client.generate(chat(i))) for i in range(3)]
        await in_flight_at(server, 3, mode)
        with pytest.raises(PolicyError, match="weight push") as failure:
            await sync.push(corrupt, 1)
        server.generation_delay_s = 0.0
        replies = await asyncio.gather(*in_flight, return_exceptions=True)
        with pytest.raises(PolicyError, match="push of version 1 failed"):
            await client.generate(chat(9))  # nothing more is sent to weights of no known version
        # The server itself serves again (vLLM: resumed on a connection of its own, the 500 closed the first).
        direct = OpenAIModel(server.base_url, "policy")
        await direct.start()
        try:
            answer = await asyncio.wait_for(direct.generate(chat(10)), 60)
        finally:
            await direct.close()
    print("failed push:", failure.value)
    assert answer.text is not None
    assert server.weight_version == "0" and [v for _, v in server.updates if v] == []  # still the labelled start
    if flavor == "vllm":
        assert "resumed" in str(failure.value)
    if mode == "wait":  # finished on the old weights before the update began: recorded with the old version
        assert {r.policy_version for r in replies if isinstance(r, Generation)} == {0}
    else:  # aborted by the push: never answered under version 1
        assert all(isinstance(r, PolicyError) and "push of version 1 failed" in str(r) for r in replies), replies


def loop_config(tmp_path: Path, model: Path, url: str, flavor: str, mode: str, iterations: int) -> LoopConfig:
    tasks = tmp_path / "coin.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in COIN_TASKS) + "\n")
    train = TrainConfig.from_dict({
        "model_dir": str(model), "algorithm": "grpo", "lr": 1e-3, "max_steps": 1, "batch_size": 8,
        "cpu_threads": 1, "progress": False, "tensorboard": False, "plots": False,
        "agent": {"response_format": "vanilla", "window": 1}}, "test")
    cfg = LoopConfig(train=train, tasks=str(tasks), iterations=iterations, mode=mode, staleness=1,
                     samples_per_task=4, concurrency=16, policy=flavor, servers=[url], served_model="policy",
                     push_mode="abort" if flavor == "vllm" else "wait", temperature=0.7, top_p=0.9, max_tokens=8,
                     step_caps=(1, 1, 1), output_dir=str(tmp_path / "rl"))
    cfg.validate()
    return cfg


def episodes(tmp_path: Path) -> list[dict]:
    [run_dir] = (tmp_path / "rl" / "rollouts").iterdir()
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]


@pytest.mark.asyncio(loop_scope="session")
async def test_async_loop_pushes_into_the_server_without_stopping_the_rollouts(
        tmp_path: Path, models: tuple[Path, Path]) -> None:
    model, _ = models
    # vLLM's default log-probs are the model's own ("raw_logprobs"), which the in-process backend records too.
    async with ServedModelTestServer(HFModel(str(model), device="cpu"), "vllm") as server:
        cfg = loop_config(tmp_path, model, server.base_url, "vllm", "async", iterations=3)
        server.restart_clock()
        reports = (await run_loop(cfg)).iterations
        server_idle = server.idle_fraction()
    # The measured idle fractions, in the test's log (pytest -s, or on failure).
    print("async loop:", [{k: r.__dict__[k] for k in ("iteration", "version", "versions_seen", "max_staleness",
                                                        "groups_ahead", "wait_s", "train_s", "browser_busy",
                                                        "browser_busy_training",
                                                        "policy_idle", "policy_idle_training", "push")}
                          for r in reports], f"server idle {server_idle:.2f}")
    assert [r.version for r in reports] == [1, 2, 3]
    assert server.weight_version == "3" and [v for _, v in server.updates] == ["1", "2", "3"]
    assert all(r.samples > 0 and r.push is not None for r in reports)
    assert all(r.max_staleness <= cfg.staleness for r in reports)  # nothing older than the bound was trained on
    # The pool did not stop for the trainer: when each training began (but the last, after which no rollout is
    # needed), groups beyond the ones trained were already running, and the browsers worked while it trained. How
    # much they worked depends on how fast rollouts are next to training (the staleness bound holds them back
    # when they are faster): the fractions are in the log above.
    assert all(r.groups_ahead > 0 for r in reports[:-1])
    assert reports[0].browser_busy_training is not None and reports[0].browser_busy_training > 0
    records = episodes(tmp_path)
    assert all(s["policy_version"] in (0, 1, 2, 3) for r in records for s in r["steps"])
    # Rollouts went on across the pushes, each step with the version that served it.
    assert {0, 1} <= {s["policy_version"] for r in records for s in r["steps"]}
    assert all(s["token_ids"] and len(s["token_ids"]) == len(s["logprobs"]) for r in records for s in r["steps"])


@pytest.mark.asyncio(loop_scope="session")
async def test_sync_loop_on_sglang_trains_each_batch_on_one_version(tmp_path: Path, models: tuple[Path, Path]) -> None:
    model, _ = models
    # SGLang's default log-probs are tempered (log_softmax(logits / T)); the trainer computes the same ones.
    hf = HFModel(str(model), device="cpu", logprobs_of="temperature")
    async with ServedModelTestServer(hf, "sglang") as server:
        cfg = loop_config(tmp_path, model, server.base_url, "sglang", "sync", iterations=2)
        reports = (await run_loop(cfg)).iterations
    assert [r.versions_seen for r in reports] == [[0], [1]]
    assert server.weight_version == "2"
    # Nothing rolled out while the trainer trained: the synchronous baseline's cost.
    assert all(r.groups_ahead == 0 for r in reports)
    assert all(r.browser_busy_training is not None and r.browser_busy_training < 0.05 for r in reports)
    metrics = [json.loads(line) for line in (tmp_path / "rl" / "iter-000" / "metrics.jsonl").read_text().splitlines()]
    # Behaviour log-probs recorded by the server equal the trainer's before the update: w = 1.
    assert metrics[0]["mean_is_weight"] == pytest.approx(1.0, abs=2e-3)


def test_the_loop_refuses_served_settings_it_cannot_train_on(tmp_path: Path, models: tuple[Path, Path]) -> None:
    from train.config import ConfigError

    model, _ = models
    cfg = loop_config(tmp_path, model, "http://127.0.0.1:9/v1", "vllm", "async", iterations=1)
    cfg.logprobs_of = "sampler"  # after top_p 0.9: GRPO's importance weights would compare two distributions
    with pytest.raises(ConfigError, match="cannot reproduce"):
        cfg.validate()
    cfg.logprobs_of, cfg.top_p, cfg.temperature = "sampler", 1.0, 1.0  # nothing applied: the model's own
    cfg.validate()
    cfg.servers = []
    with pytest.raises(ConfigError, match="needs servers"):
        cfg.validate()
