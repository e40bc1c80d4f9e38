"""The engine against vLLM itself: ``vllm serve`` (vLLM 0.32's CPU build, ``.venv-vllm``) on a tiny Qwen2.5-VL built
offline, the engine in the project's environment talking to it over HTTP, as on a GPU machine.

- ``webgym-engine run --policy openai --token-ids --logprobs-of model`` runs bundled episodes against the server:
  each step's reply, its token ids and their log-probabilities (of the model's own distribution, the whole
  vocabulary), and the screenshot sent with it are recorded; a random model's garbage replies end as honest
  failures, not errors.
- The weight push the RL loop makes after every update (``policy.weight_sync.VLLMSync``): pause, ``reload_weights``
  through ``/collective_rpc``, the version label, resume; the pushed weights answer, labelled, and pushing the first
  checkpoint back gives its replies again, token for token.
- The signal check: the trainer's log-probabilities of the recorded replies are those vLLM served.
- A push of a corrupt checkpoint fails, leaves the server serving, and no reply is recorded under its version.

``make test`` builds ``.venv-vllm`` and runs this file with the project's interpreter (docs/vllm-cpu.md), beside
test_vllm_in_process.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from bench.vllm_cpu import vllm_server
from engine.agent.model_api import ChatRequest, SamplingParams
from engine.agent.policy_api import PolicyError
from policy.openai_backend import OpenAIModel
from policy.tiny_models import build_tiny_model
from policy.weight_sync import WeightSync, server_sync

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 400  # an allowance: the server starts beside the other tests of make test's first phase


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny Qwen2.5-VL checkpoints of one shape (the start and a 'trained' one). Hidden size 128: vLLM's CPU
    attention takes head sizes from 32."""
    root = tmp_path_factory.mktemp("vllm-models")
    return (build_tiny_model(root / "start", "qwen2_5_vl", seed=0, hidden_size=128),
            build_tiny_model(root / "trained", "qwen2_5_vl", seed=1, hidden_size=128))


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve`` of the start checkpoint, as docs/vllm-cpu.md starts it; its API root."""
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    try:
        with vllm_server(models[0], log, START_TIMEOUT_S) as started:
            yield started.base_url
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def served_run(server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of ``webgym-engine run`` with the served policy: 4 bundled episodes against the server."""
    out = tmp_path_factory.mktemp("runs")
    proc = subprocess.run([sys.executable, "-m", "cli.main", "run", "--policy", "openai", "--base-url", server,
                           "--model", "policy", "--token-ids", "--logprobs-of", "model", "--max-tokens", "24",
                           "--episodes", "4",
                           "--workers", "1", "--concurrency", "4", "--telemetry", "off", "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = out.iterdir()
    return run_dir


def test_a_run_against_vllm_records_each_reply_with_its_tokens_and_screenshot(served_run: Path) -> None:
    run_dir = served_run
    records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4
    # A random model's replies parse as nothing: honest failures (or steps that ran out), never engine errors.
    assert {r["status"] for r in records} <= {"failure", "step_limit"}, [r["status"] for r in records]
    steps = [s for r in records for s in r["steps"] if s.get("reply") is not None]
    assert steps
    for step in steps:
        assert 0 < len(step["token_ids"]) <= 24 and len(step["logprobs"]) == len(step["token_ids"])
        assert all(lp <= 0.0 for lp in step["logprobs"])
        # vLLM's raw log-probs: the model's own distribution, over the whole vocabulary.
        assert (step["parsed"]["logprobs_of"], step["parsed"]["logprobs_vision_masked"]) == ("model", False)
        assert (run_dir / step["screenshot"]).stat().st_size > 0
        assert any(isinstance(p, dict) and p.get("type") == "image" for m in step["messages"] for p in m["content"])


def test_the_trainer_recomputes_the_log_probabilities_vllm_recorded(served_run: Path, models: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """The signal check: before any update, the trainer's log-probabilities of the served replies are those vLLM
    recorded (float32, as docs/vllm-cpu.md serves; the prompts rebuilt from the records), and GRPO takes them as
    behaviour log-probabilities (``--logprobs-of model``: vLLM's default, the model's own distribution)."""
    from train.behaviour import require_comparable
    from train.config import TrainConfig
    from train.samples import build_samples
    from train.trainer import Trainer

    samples = build_samples(served_run, models[0])
    # vLLM samples from the whole vocabulary: a random model's reply may hold a vision placeholder, which the
    # trainer leaves out (it would read it as part of an image); nothing else may be left out.
    assert set(samples.skipped) <= {"vision token in reply"}, samples.skipped
    assert len(samples.samples) >= 8, samples.skipped
    require_comparable(samples.samples)
    cfg = TrainConfig(model_dir=str(models[0]), output_dir=str(tmp_path), algorithm="grpo", device="cpu",
                      progress=False, plots=False, tensorboard=False)
    trainer = Trainer(cfg, samples)
    trainer.compute_proximal()
    assert trainer.prox is not None
    gaps = [abs(p - b) for s, prox in zip(samples.samples, trainer.prox, strict=True)
            for p, b in zip(prox, s.behaviour_logprobs or [], strict=True)]
    assert len(gaps) == sum(len(s.target_ids) for s in samples.samples)
    print(f"signal check: {len(gaps)} tokens, the trainer's log-probs at most {max(gaps):.1e} from vLLM's")
    assert max(gaps) <= 2e-3, max(gaps)


def _ask(i: int) -> ChatRequest:
    return ChatRequest(f"r{i}", [{"role": "user", "content": [{"type": "text", "text": f"click the red square {i}"}]}],
                       {}, SamplingParams(temperature=0.0, max_tokens=12))


async def _paused(server: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(server.removesuffix("/v1") + "/is_paused") as reply:
        return bool((await reply.json())["is_paused"])


@asynccontextmanager
async def pushing(server: str) -> AsyncIterator[tuple[OpenAIModel, WeightSync]]:
    """A client of ``server`` recording token ids and log-probs, and the loop's push into it, started."""
    client = OpenAIModel(server, "policy", token_ids=True, logprobs_of="model")
    sync = server_sync("vllm", [client], "abort")
    await client.start()
    try:
        await sync.start()
        yield client, sync
    finally:
        await sync.close()
        await client.close()


async def test_a_push_reloads_the_served_weights_and_labels_their_replies(server: str,
                                                                          models: tuple[Path, Path]) -> None:
    start, trained = models
    async with pushing(server) as (client, sync):
        before = await client.generate(_ask(0))
        report = await sync.push(trained, 1)
        after = await client.generate(_ask(0))
        back = await sync.push(start, 2)
        again = await client.generate(_ask(0))
    assert (before.policy_version, after.policy_version, again.policy_version) == (0, 1, 2)
    assert report.version == 1 and back.version == 2
    assert after.token_ids != before.token_ids  # the pushed weights answer
    assert again.token_ids == before.token_ids  # and the first checkpoint's, pushed back, answer as before
    assert again.logprobs == pytest.approx(before.logprobs, abs=1e-4)
    assert not await _paused(server)


async def test_a_failed_push_stops_with_an_error_that_names_the_server_and_records_nothing_under_its_version(
        server: str, models: tuple[Path, Path], tmp_path: Path) -> None:
    # Last in this file: vLLM 0.32's engine may not survive a checkpoint it cannot load.
    start, _ = models
    corrupt = tmp_path / "corrupt"  # a checkpoint whose weights file was cut short (a trainer killed mid-write)
    shutil.copytree(start, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    async with pushing(server) as (client, sync):
        with pytest.raises(PolicyError, match="weight push") as failure:
            await sync.push(corrupt, 7)
        with pytest.raises(PolicyError, match="push of version 7 failed"):
            await client.generate(_ask(1))  # nothing is sent to weights of no known version
    print("failed push:", failure.value)
    assert server.removesuffix("/v1") in str(failure.value)
    try:
        paused = await _paused(server)
    except aiohttp.ClientError:
        return  # the server died of it (seen once): the error above is all that is left to say
    assert paused is False  # a server that still answers is never left paused
