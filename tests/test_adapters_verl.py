"""The veRL agent loop's episode logic (``train.adapters.verl.WebAgentLoopMixin``) on the bundled sites, in the
project's own environment, where veRL is not installed (veRL 0.9.1 requires ``transformers<5.11``).

``tests/frameworks/test_verl.py`` runs the real ``WebAgentLoop`` in veRL's own environment (``make test`` builds it):
veRL's token builder, its output validation and its worker's post-processing. Here two stand-ins, named as such,
take veRL's place, so that the episode logic is checked where the rest of the project is:

- :class:`tests.verl_server_stand_in.VerlServerManagerStandIn` for veRL's server manager (its vLLM / SGLang servers
  need a GPU), which checks each prompt's image placeholders as vLLM does;
- :class:`VerlAgentLoopBaseStandIn` for what the loop takes from ``AgentLoopBase``: ``server_manager``,
  ``tokenizer``, ``rollout_config.response_length``, ``ct_build_initial_tokens`` (the processor's chat template,
  then the processor with the images) and ``make_output``, which returns the fields of ``AgentLoopOutput`` as a dict.

Real parts throughout: the engine core with its site server and Chromium workers, and a tiny Qwen3-VL tokenizer and
image processor built offline (:func:`tests.verl_server_stand_in.tiny_processor`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the veRL adapter test needs torch and transformers (pip install -e '.[hf]')")
pytest.importorskip("transformers", reason="the veRL adapter test needs transformers (pip install -e '.[hf]')")

from engine.clients.gym_env import CoreThread  # noqa: E402
from engine.core.config import RunConfig  # noqa: E402
from engine.store.run_dir import read_records  # noqa: E402
from engine.tasks.loading import load_tasks  # noqa: E402
from engine.tasks.schema import Task
from tests.conftest import subset  # noqa: E402
from tests.verl_server_stand_in import SCRIPT, VerlServerManagerStandIn, tiny_processor  # noqa: E402
from train.adapters import jpeg_to_pil  # noqa: E402
from train.adapters.verl import AGENT_NAME, WebAgentLoopMixin, dataset_rows  # noqa: E402


class VerlAgentLoopBaseStandIn:
    """A stand-in for what the loop takes from veRL's ``AgentLoopBase`` (module docstring)."""

    def __init__(self, server_manager: VerlServerManagerStandIn, processor: Any, response_length: int) -> None:
        self.server_manager = server_manager
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.rollout_config = SimpleNamespace(response_length=response_length)

    async def ct_build_initial_tokens(self, messages: list[dict[str, Any]], images: list[Any] | None = None,
                                      **kwargs: Any) -> list[int]:
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.processor(text=[text], images=images)["input_ids"][0])

    def make_output(self, fields: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "metrics": metrics}


class StandInWebAgentLoop(WebAgentLoopMixin, VerlAgentLoopBaseStandIn):
    """The adapter's episode logic on the ``AgentLoopBase`` stand-in."""


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tiny_processor(tmp_path_factory.mktemp("verl_model"))


@pytest.fixture
def core(tmp_path: Path) -> Iterator[CoreThread]:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    with CoreThread(cfg, serve_sites=True) as core:
        yield core


def check_episode(outputs: list[dict[str, Any]], server: VerlServerManagerStandIn, core: CoreThread,
                  task: Task, tokenizer: Any) -> None:
    """One output per step, each the step's own prompt and reply, the reward on the last; as recorded."""
    assert len(outputs) == len(SCRIPT) == len(server.calls)
    [record] = read_records(core.run_dir)  # type: ignore[arg-type]
    assert record["task"]["task_id"] == task.task_id and record["status"] in ("success", "failure")
    assert [s["action"]["name"] for s in record["steps"]] == ["wait", "scroll", "answer"]
    assert record["steps"][0]["parse_error"] and record["steps"][2]["parse_error"] is None
    frames = [np.asarray(jpeg_to_pil(Path(core.run_dir, s["screenshot"]).read_bytes()))  # type: ignore[arg-type]
              for s in record["steps"]]
    reward = float(record["reward"]["value"])
    assert len({call["request_id"] for call in server.calls}) == 1  # one sticky session per episode
    for i, (out, call, step) in enumerate(zip(outputs, server.calls, record["steps"], strict=True)):
        # The prompt is the step's chat with the context window's screenshots (all of them, here), in order.
        assert out["prompt_ids"] == call["prompt_ids"]
        images = out["multi_modal_data"]["images"]
        assert len(images) == i + 1
        assert all(np.array_equal(np.asarray(im), f) for im, f in zip(images, frames[: i + 1], strict=True))
        decoded = tokenizer.decode(out["prompt_ids"])
        assert task.task_name in decoded and decoded.count("<|vision_start|>") == i + 1
        # The response is the server's tokens; its text stepped the env, which recorded it with the tokens.
        assert out["response_ids"] == step["token_ids"] and out["response_mask"] == [1] * len(out["response_ids"])
        assert out["response_logprobs"] == step["logprobs"] == [-0.5] * len(out["response_ids"])
        assert step["reply"] == SCRIPT[i]
        assert out["extra_fields"]["step"] == i and out["extra_fields"]["episode_id"] == record["episode_id"]
        assert out["reward_score"] == (reward if i == len(outputs) - 1 else None)
    assert outputs[-1]["extra_fields"]["reward_extra_info"] == {"episode_status": record["status"],
                                                                "env_reward": reward}
    assert all("reward_extra_info" not in out["extra_fields"] for out in outputs[:-1])


async def test_agent_loop_emits_one_sample_per_step(core: CoreThread, processor: Any, tmp_path: Path) -> None:
    tasks = load_tasks(subset(tmp_path, per_site=1), core.base_url)[:1]
    server = VerlServerManagerStandIn(processor, SCRIPT)
    loop = StandInWebAgentLoop(server, processor, response_length=256)
    loop.web_setup(core=core, tasks=tasks)
    [row] = dataset_rows(tasks)
    assert row["agent_name"] == AGENT_NAME and json.dumps(row)  # a plain row: parquet-able
    outputs = await loop.run({"temperature": 1.0, "logprobs": True}, raw_prompt=row["prompt"], **{
        k: v for k, v in row.items() if k != "prompt"})
    assert all(call["sampling_params"] == {"temperature": 1.0, "logprobs": True} for call in server.calls)
    check_episode(outputs, server, core, tasks[0], processor.tokenizer)


async def test_response_is_capped_at_the_response_length(core: CoreThread, processor: Any, tmp_path: Path) -> None:
    tasks = load_tasks(subset(tmp_path, per_site=1), core.base_url)[:1]
    loop = StandInWebAgentLoop(VerlServerManagerStandIn(processor, SCRIPT), processor, response_length=8)
    loop.web_setup(core=core, tasks=tasks)
    outputs = await loop.run({}, task_id=tasks[0].task_id)
    assert [len(out["response_ids"]) for out in outputs] == [8, 8, 8]
    assert all(len(out["response_logprobs"]) == len(out["response_mask"]) == 8 for out in outputs)
    with pytest.raises(KeyError, match="task"):
        await loop.run({}, raw_prompt=[])
