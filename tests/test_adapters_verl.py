"""The veRL agent loop (``train.adapters.verl``) runs web episodes on the bundled sites, one sample per step.

veRL is not installed in this project's environment: veRL 0.9.1 requires ``transformers<5.11`` (this project runs
5.24), and its rollout servers (vLLM, SGLang) need a GPU. So two stand-ins, named as such, take veRL's place:

- :class:`VerlServerManagerStandIn` mimics veRL's server manager call, ``await server_manager.generate(request_id,
  *, prompt_ids, sampling_params, image_data) -> TokenOutput`` (``token_ids``, ``log_probs``). Like a vLLM server it
  checks that the prompt's image placeholders match the images it is given (one ``<|vision_start|>`` per image and
  as many ``<|image_pad|>`` tokens as the image processor makes merged patches), then answers with a scripted
  reply's tokens and log-probabilities.
- :class:`VerlAgentLoopBaseStandIn` provides what the loop takes from ``AgentLoopBase``: ``server_manager``,
  ``tokenizer``, ``rollout_config.response_length``, ``ct_build_initial_tokens`` (rendered as veRL's
  vision-language token builder renders a prompt: the processor's chat template, then the processor with the
  images) and ``make_output``, which returns the fields of veRL's ``AgentLoopOutput`` as a dict.

``test_real_verl_agent_loop`` runs the same episode through the real ``WebAgentLoop`` (veRL's ``AgentLoopBase``,
its token builder and ``AgentLoopOutput``) with the server stand-in; it is skipped where veRL cannot be imported.

Real parts throughout: the engine core with its site server and Chromium workers, and a tiny Qwen3-VL tokenizer and
image processor built offline (``policy.tiny_models``). The processor is ``Qwen3VLProcessor`` without its video
processor, which needs torchvision (not installed here: its PyPI wheel would replace the CPU build of torch).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the veRL adapter test needs torch and transformers (pip install -e '.[hf]')")
pytest.importorskip("transformers", reason="the veRL adapter test needs transformers (pip install -e '.[hf]')")

from transformers import AutoImageProcessor, AutoTokenizer  # noqa: E402

from engine.clients.gym_env import CoreThread  # noqa: E402
from engine.core.config import RunConfig  # noqa: E402
from engine.store.run_dir import read_records  # noqa: E402
from engine.tasks.loading import load_tasks  # noqa: E402
from engine.tasks.schema import Task
from policy.tiny_models import build_tiny_model  # noqa: E402
from tests.conftest import subset  # noqa: E402
from tests.image_processor import ImageOnlyQwen3VLProcessor  # noqa: E402
from train.adapters import jpeg_to_pil  # noqa: E402
from train.adapters.verl import AGENT_NAME, WebAgentLoopMixin, dataset_rows  # noqa: E402

SCRIPT = [
    "Action: click it\n<tool_call>\n{broken",  # unusable: the engine records a wait and its parse error
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "scroll", "direction": "down"}}\n</tool_call>',
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "answer", "text": "done"}}\n</tool_call>',
]




@dataclass
class VerlServerManagerStandIn:
    """A stand-in for veRL's server manager (module docstring): checks a prompt like vLLM, answers from a script."""

    processor: Any
    script: list[str]
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: list[Any] | None = None, **kwargs: Any) -> SimpleNamespace:
        tok = self.processor.tokenizer
        images = image_data or []
        starts = prompt_ids.count(tok.convert_tokens_to_ids("<|vision_start|>"))
        pads = prompt_ids.count(tok.convert_tokens_to_ids("<|image_pad|>"))
        grids = self.processor.image_processor(images=images)["image_grid_thw"] if images else []
        merge = self.processor.image_processor.merge_size ** 2
        assert starts == len(images) and pads == sum(int(np.prod(g)) // merge for g in grids), (starts, pads)
        reply = self.script[len(self.calls) % len(self.script)]
        token_ids = tok.encode(reply, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        self.calls.append({"request_id": request_id, "prompt_ids": prompt_ids, "images": images,
                           "sampling_params": sampling_params})
        return SimpleNamespace(token_ids=token_ids, log_probs=[-0.5] * len(token_ids), num_preempted=0)


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
    model_dir = build_tiny_model(tmp_path_factory.mktemp("verl_model"), "qwen3_vl", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return ImageOnlyQwen3VLProcessor(AutoImageProcessor.from_pretrained(model_dir), tokenizer,
                                     chat_template=tokenizer.chat_template)


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


async def test_real_verl_agent_loop(core: CoreThread, processor: Any, tmp_path: Path) -> None:
    agent_loop = pytest.importorskip(
        "verl.experimental.agent_loop.agent_loop",
        reason="veRL is not installed: veRL 0.9.1 requires transformers<5.11 (this project runs 5.24)")
    from omegaconf import OmegaConf

    from train.adapters.verl import WebAgentLoop

    tasks = load_tasks(subset(tmp_path, per_site=1), core.base_url)[:1]
    server = VerlServerManagerStandIn(processor, SCRIPT)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 256}},
                               "data": {}})
    loop = WebAgentLoop(trainer_config=agent_loop.DictConfigWrap(config), server_manager=server,
                        tokenizer=processor.tokenizer, processor=processor, dataset_cls=object,
                        data_config=agent_loop.DictConfigWrap(config.data), hf_model_type="qwen3_vl",
                        core=core, tasks=tasks)
    assert agent_loop._agent_loop_registry[AGENT_NAME] == {"_target_": "train.adapters.verl.WebAgentLoop"}
    outputs = await loop.run({"temperature": 1.0}, **dataset_rows(tasks)[0])
    assert all(isinstance(out, agent_loop.AgentLoopOutput) for out in outputs)
    check_episode([out.model_dump() for out in outputs], server, core, tasks[0], processor.tokenizer)
    assert outputs[-1].as_dict()["rm_scores"][-1] == outputs[-1].reward_score  # veRL's token-level reward
