"""TRL's GRPOTrainer trains a vision-language model on the bundled sites through ``train.adapters.trl``.

Real parts throughout: TRL's ``GRPOTrainer`` (its generation, its multi-turn tool loop with multimodal tool
responses, its GRPO loss and optimizer step), a tiny random Qwen3-VL built offline (``policy.tiny_models``) with
TRL's own Qwen3-VL chat template and response parser, and the engine core with its site server and Chromium
workers. Two accommodations, neither of them a stand-in for TRL:

- the processor is ``Qwen3VLProcessor`` without its video processor: the video processor needs torchvision,
  which is not installed here (the torchvision wheel on PyPI would replace the CPU build of torch);
- the random model is steered by a generation setting (``GenerationConfig.sequence_bias``, through
  ``GRPOConfig.generation_kwargs``) to write two fixed tool calls, a scroll after the first screenshot and an
  answer after the second, so that each rollout takes real steps in its episode; what it writes after the
  episode has ended is its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the TRL adapter test needs torch (pip install -e '.[hf,trl]')")
pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl]')")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoTokenizer,
)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen3_vl_chat_template  # noqa: E402

from engine.config import RunConfig  # noqa: E402
from engine.gym_env import CoreThread  # noqa: E402
from engine.store import read_records  # noqa: E402
from engine.tasks import load_tasks  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from tests.conftest import subset  # noqa: E402
from tests.image_processor import ImageOnlyQwen3VLProcessor  # noqa: E402
from train.adapters import jpeg_to_pil  # noqa: E402
from train.adapters.trl import WebEnvironment, environment_factory, web_dataset  # noqa: E402


def tool_call(arguments: dict[str, Any]) -> str:
    return '<tool_call>\n' + json.dumps({"name": "computer_use", "arguments": arguments}) + '\n</tool_call>'


def forced_replies(tokenizer: Any, script: list[tuple[str, str]]) -> list[list[Any]]:
    """``sequence_bias`` entries that make the model write ``reply`` right after ``context`` (each token biased
    only after the whole context and the reply's earlier tokens, so exactly one entry matches at a time)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    entries: list[list[Any]] = []
    for context, reply in script:
        anchor = tokenizer.encode(context, add_special_tokens=False)
        tokens = tokenizer.encode(reply, add_special_tokens=False) + [end]
        entries += [[anchor + tokens[: k + 1], 1000.0] for k in range(len(tokens))]
    return entries


def test_grpo_trainer_trains_on_web_episodes(tmp_path: Path) -> None:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=4, workers=1, telemetry=None)
    with CoreThread(cfg, serve_sites=True) as core:
        tasks = load_tasks(subset(tmp_path, per_site=1), core.base_url)[:1]
        model_dir = build_tiny_model(tmp_path / "model", "qwen3_vl", seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.chat_template = qwen3_vl_chat_template  # the released model's, which TRL's parser knows
        processor = ImageOnlyQwen3VLProcessor(AutoImageProcessor.from_pretrained(model_dir), tokenizer,
                                              chat_template=qwen3_vl_chat_template)
        shown: list[Any] = []  # every image the processor turns into pixels, generation and loss alike
        preprocess = processor.image_processor.preprocess

        def spy(images: Any, *args: Any, **kwargs: Any) -> Any:
            pending = [images]
            while pending:  # an image, a list of them, or a list per sample
                item = pending.pop()
                if isinstance(item, list | tuple):
                    pending.extend(item)
                else:
                    shown.append(item)
            return preprocess(images, *args, **kwargs)

        processor.image_processor.preprocess = spy

        # After the first screenshot (the end of the user turn) a scroll, after the next one (the end of the tool
        # answer) an answer; nothing is forced after the episode's end (a text answer, no screenshot).
        turn = "<|im_end|>\n<|im_start|>assistant\n"
        bias = forced_replies(tokenizer, [
            ("<|vision_end|>" + turn, tool_call({"action": "scroll", "direction": "down"})),
            ("<|vision_end|>\n</tool_response>" + turn, tool_call({"action": "answer", "text": "done"})),
        ])
        args = GRPOConfig(
            output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
            max_completion_length=192, max_tool_calling_iterations=3, learning_rate=1e-4, logging_steps=1,
            report_to="none", save_strategy="no", use_cpu=True, bf16=False, activation_checkpointing=False,
            generation_kwargs={"sequence_bias": bias}, seed=0,
        )
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
        encoded: list[tuple[int, bool]] = []  # per pass of the vision tower: images encoded, under autograd?

        def count(_module: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            grid = kwargs["grid_thw"] if "grid_thw" in kwargs else inputs[1]
            encoded.append((len(grid), torch.is_grad_enabled()))

        model.model.visual.register_forward_pre_hook(count, with_kwargs=True)
        trainer = GRPOTrainer(model=model, args=args, processing_class=processor,
                              train_dataset=web_dataset(tasks, viewport=core.core.cfg.worker, repeat=2),
                              environment_factory=environment_factory(core, tasks))
        trainer.train()
        envs: list[WebEnvironment] = trainer._environment_pool[None]  # the instances TRL made and used

    # The step ran: a loss was logged (0 here: both rollouts of the group got the same reward, so GRPO's
    # advantages are 0), from a forward pass with the screenshots.
    logs = trainer.state.log_history
    assert trainer.state.global_step == 1 and any("loss" in entry for entry in logs), logs
    metrics = next(entry for entry in logs if "loss" in entry)
    assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"]) and metrics["entropy"] > 0
    assert metrics["tools/call_frequency"] >= 2.0 and metrics["tools/failure_frequency"] == 0.0

    # Each of the two rollouts was one engine episode: a scroll, then the answer that ended it.
    assert len(envs) == 2 and all(env.steps == 2 and env.record is not None for env in envs)
    records = read_records(core.run_dir)  # type: ignore[arg-type]
    assert sorted(r["episode_id"] for r in records) == sorted(env.episode_id for env in envs)
    for record in records:
        assert record["task"]["task_id"] == tasks[0].task_id and record["status"] in ("success", "failure")
        assert [s["action"]["name"] for s in record["steps"]] == ["scroll", "answer"]
        assert all(s["parse_error"] is None for s in record["steps"])
    assert metrics["rewards/WebEnvironment/mean"] == pytest.approx(np.mean([env.reward for env in envs]))

    # The screenshots the episodes recorded are the images the model was given: the first page in the prompt,
    # the page after the scroll in the tool's answer, for both rollouts, when generating and in the loss.
    frames = [np.asarray(jpeg_to_pil(Path(core.run_dir, s["screenshot"]).read_bytes()))  # type: ignore[arg-type]
              for r in records for s in r["steps"]]
    given = [np.asarray(image.convert("RGB")) for image in shown]
    assert len(frames) == 4 and all(any(np.array_equal(f, g) for g in given) for f in frames)
    assert (4, True) in encoded  # the loss's forward pass (under autograd) encoded all four screenshots
