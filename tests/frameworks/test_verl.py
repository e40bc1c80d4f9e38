"""The veRL adapter against veRL itself: ``WebAgentLoop`` built, run and post-processed by veRL's own code.

Runs in the veRL environment that ``make test`` builds (``.venv-verl``: veRL at the version ``pyproject.toml``'s
``verl`` extra pins, with its ``verl-core`` dependencies, on the CPU build of torch); never in the project's main
environment. What of veRL runs:

- the agent loop registry and ``hydra.utils.instantiate`` of an ``agent_loop_config_path`` entry, exactly as veRL's
  agent-loop worker builds a loop per trajectory (``AgentLoopWorker._run_agent_loop``);
- ``AgentLoopBase`` (the adapter's base class), its continuous-token builder (``ct_build_initial_tokens``) turning
  each step's chat and screenshots into prompt ids, and the ``AgentLoopOutput`` / ``AgentLoopMetrics`` validation;
- the TransferQueue agent-loop worker's post-processing (``AgentLoopWorkerTQ._agent_loop_postprocess``, the
  ``trainer.use_v1`` path): the reward of the last output copied to the others, ``as_dict``, the multimodal
  inputs its processor computes from the screenshots and the Qwen-VL position ids, one sample per output.

Stand-ins, named as such: :class:`tests.verl_server_stand_in.VerlServerManagerStandIn` for veRL's server manager
(its vLLM / SGLang servers need a GPU), and a list in place of the TransferQueue store that
``tq.async_kv_batch_put`` writes to (a Ray-actor store; the samples it would hold are what the test reads). The
processor is the tiny Qwen3-VL's without its video processor (:func:`tests.verl_server_stand_in.tiny_processor`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pytest
import torch
import verl
from omegaconf import OmegaConf
from verl.experimental.agent_loop import agent_loop
from verl.trainer.ppo.v1 import agent_loop_tq

from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.tasks.schema import BUNDLED_TASKS
from tests.conftest import subset
from tests.verl_server_stand_in import SCRIPT, VerlServerManagerStandIn, tiny_processor
from train.adapters import close_shared_cores, jpeg_to_pil, shared_core
from train.adapters.verl import AGENT_NAME, VERL, dataset_rows

PROMPT_LENGTH, RESPONSE_LENGTH = 8192, 256


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tiny_processor(tmp_path_factory.mktemp("verl_model"))


@pytest.fixture(scope="module")
def run_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The engine settings of the agent loop's configuration entry (the loops share one core per settings)."""
    runs = tmp_path_factory.mktemp("verl_runs")
    yield {"output_dir": str(runs), "concurrency": 2, "workers": 1, "telemetry": None}
    close_shared_cores()


def trainer_config() -> Any:
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": PROMPT_LENGTH,
                                                               "response_length": RESPONSE_LENGTH}},
                             "data": {}})


def registered_entry(tmp_path: Path, **fields: Any) -> Any:
    """The adapter's entry of an ``agent_loop_config_path`` file (docs/trainers/verl.md), registered as veRL's
    agent-loop worker registers the entries of that file."""
    path = tmp_path / "agent_loops.yaml"
    path.write_text(OmegaConf.to_yaml([{"name": AGENT_NAME, "_target_": "train.adapters.verl.WebAgentLoop",
                                        **fields}]))
    for entry in OmegaConf.load(path):
        agent_loop._agent_loop_registry[entry.name] = entry
    return agent_loop._agent_loop_registry[AGENT_NAME]


def instantiate(server: VerlServerManagerStandIn, processor: Any) -> Any:
    """The registered loop as ``AgentLoopWorker._run_agent_loop`` builds it for each trajectory."""
    config = trainer_config()
    return hydra.utils.instantiate(
        config=agent_loop._agent_loop_registry[AGENT_NAME], trainer_config=agent_loop.DictConfigWrap(config=config),
        server_manager=server, tokenizer=processor.tokenizer, processor=processor, hf_model_type="qwen3_vl",
        dataset_cls=object, data_config=agent_loop.DictConfigWrap(config.data), tools=agent_loop.ToolListWrap([]))


def tq_worker(processor: Any) -> Any:
    """veRL's TransferQueue agent-loop worker with what its post-processing reads (its constructor starts Ray
    actors for the rollout servers, which need a GPU)."""
    worker = object.__new__(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__)  # the class under @ray.remote
    worker.config = trainer_config()
    worker.tokenizer, worker.processor = processor.tokenizer, processor
    worker.reward_loop_worker_handles = None  # the reward comes from the engine, on the last output
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = {}
    return worker


async def postprocess(worker: Any, outputs: list[Any], row: dict[str, Any],
                      monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The samples veRL's TransferQueue worker makes of ``outputs`` (the store a stand-in list)."""
    stored: list[dict[str, Any]] = []

    async def put(*, keys: list[str], fields: Any, tags: list[dict[str, Any]], partition_id: str) -> None:
        for i, (key, tag) in enumerate(zip(keys, tags, strict=True)):
            stored.append({"key": key, "tag": tag, "partition": partition_id, "fields": fields[i]})

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", put)
    await worker._agent_loop_postprocess(outputs, False, uid="u0", session_id=0, global_steps=1, **row)
    return stored


def test_the_tested_version_is_installed() -> None:
    assert verl.__version__ == VERL.tested == VERL.check()


async def test_real_agent_loop_one_valid_output_per_step(processor: Any, run_config: dict[str, Any],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = shared_core(run_config)
    task_file = subset(tmp_path, per_site=1)
    entry = registered_entry(tmp_path, task_file=str(task_file), run_config=run_config,
                             agent={"coords": "grid", "window": 4})
    server = VerlServerManagerStandIn(processor, SCRIPT)
    loop = instantiate(server, processor)
    assert isinstance(loop, agent_loop.AgentLoopBase) and loop.web_core is core
    # Building the class kept the registered settings for the next trajectory's loop.
    assert agent_loop._agent_loop_registry[AGENT_NAME] is entry and loop.web_agent.window == 4
    task = load_tasks(task_file, core.base_url)[0]
    row = dataset_rows([task])[0]
    outputs = await loop.run({"temperature": 1.0, "logprobs": True}, raw_prompt=row["prompt"], **{
        k: v for k, v in row.items() if k != "prompt"})

    # veRL's own validation: every output is an AgentLoopOutput, one per step, rendered by veRL's token builder.
    assert len(outputs) == len(SCRIPT) == len(server.calls)
    assert all(isinstance(out, agent_loop.AgentLoopOutput) for out in outputs)
    [record] = [r for r in read_records(core.run_dir) if r["task"]["task_id"] == task.task_id]
    assert [s["action"]["name"] for s in record["steps"]] == ["wait", "scroll", "answer"]
    reward = float(record["reward"]["value"])
    frames = [np.asarray(jpeg_to_pil(Path(core.run_dir, s["screenshot"]).read_bytes())) for s in record["steps"]]
    for i, (out, call, step) in enumerate(zip(outputs, server.calls, record["steps"], strict=True)):
        assert out.prompt_ids == call["prompt_ids"]  # what veRL's builder made is what the server was sent
        decoded = processor.tokenizer.decode(out.prompt_ids)
        assert task.task_name in decoded and decoded.count("<|vision_start|>") == i + 1
        images = out.multi_modal_data["images"]  # the context window's screenshots (all of them, here), in order
        assert len(images) == i + 1
        assert all(np.array_equal(np.asarray(im), f) for im, f in zip(images, frames[: i + 1], strict=True))
        assert out.response_ids == step["token_ids"] and out.response_logprobs == step["logprobs"]
        assert out.reward_score == (reward if i == len(outputs) - 1 else None)
    assert outputs[-1].as_dict()["rm_scores"][-1] == reward  # veRL's token-level reward on the last token

    # veRL's TransferQueue worker turns each output into a training sample, the episode's reward on all of them.
    stored = await postprocess(tq_worker(processor), outputs, row, monkeypatch)
    assert [s["key"] for s in stored] == ["u0_0_0", "u0_0_1", "u0_0_2"]
    for i, sample in enumerate(stored):
        fields = sample["fields"]
        assert sample["tag"]["status"] == "success" and sample["partition"] == "train"
        # The episode's reward on the sample's last response token (veRL's token-level reward), for every step.
        assert float(fields["rm_scores"][-1]) == float(fields["rm_scores"].sum()) == reward
        assert fields["prompts"].tolist() == outputs[i].prompt_ids
        assert fields["input_ids"].tolist() == outputs[i].prompt_ids + outputs[i].response_ids
        # The screenshots reached the model's inputs: the processor's patches, one grid per image in the prompt.
        grids = fields["multi_modal_inputs"]["image_grid_thw"]
        assert grids.shape == (i + 1, 3) and fields["multi_modal_inputs"]["pixel_values"].shape[0] == int(
            torch.prod(grids, dim=1).sum())
        assert fields["position_ids"].shape[-1] == len(fields["input_ids"])  # Qwen-VL's 3-D rope positions
        assert fields["extra_fields"]["reward_extra_info"]["env_reward"] == reward


async def test_an_episode_that_ends_as_it_opens_gives_one_valid_output(
        processor: Any, run_config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A page-driven task whose page says "done, reward 1" at once: the episode ends before the model is asked.
    first = json.loads(BUNDLED_TASKS.read_text().splitlines()[0])
    task_file = tmp_path / "ends_at_once.jsonl"
    ends = {"task_id": "ends-at-once", "probe_js": "({done: true, raw_reward: 1, reward: 1})", "reward_source": "page"}
    task_file.write_text(json.dumps({**first, **ends}) + "\n")
    server = VerlServerManagerStandIn(processor, SCRIPT)
    registered_entry(tmp_path, task_file=str(task_file), run_config=run_config)
    loop = instantiate(server, processor)
    row = dataset_rows(load_tasks(task_file, shared_core(run_config).base_url))[0]
    outputs = await loop.run({"temperature": 1.0, "logprobs": True}, raw_prompt=row["prompt"], **{
        k: v for k, v in row.items() if k != "prompt"})
    assert server.calls == []  # the model was never asked
    [out] = outputs  # one output, so that veRL's GRPO group keeps its size
    assert isinstance(out, agent_loop.AgentLoopOutput)
    assert out.reward_score == 1.0 and out.response_mask == [0] * len(out.response_ids)  # nothing to learn from
    assert out.extra_fields["reward_extra_info"]["env_reward"] == 1.0
    [sample] = await postprocess(tq_worker(processor), outputs, row, monkeypatch)
    assert float(sample["fields"]["rm_scores"][-1]) == 1.0 and sample["fields"]["loss_mask"].sum() == 0
