"""TRL's GRPOTrainer trains a vision-language model on the bundled sites through ``train.adapters.trl``, and the
engine's rewards move the model.

Real parts throughout: TRL's ``GRPOTrainer`` (its generation, its multi-turn tool loop with multimodal tool
responses, its GRPO advantages, loss and optimizer steps), a tiny random Qwen3-VL built offline
(``policy.tiny_models``) with TRL's own Qwen3-VL chat template and response parser, and the engine core with its
site server and Chromium workers, whose task check gives each rollout its reward. Two accommodations, neither of
them a stand-in for TRL:

- the processor is ``Qwen3VLProcessor`` without its video processor: the video processor needs torchvision,
  which is not installed here (the torchvision wheel on PyPI would replace the CPU build of torch);
- the random model is steered by a generation setting (``GenerationConfig.sequence_bias``, through
  ``GRPOConfig.generation_kwargs``) to write fixed tool calls, so that each rollout takes real steps in its
  episode: a scroll after the first screenshot; after the second, an answer, either the task's (reward 1) or a
  wrong one (reward 0); nothing once the episode has ended. The two answers get the same bias where they part,
  so there the model's own odds and TRL's sampling choose. The model's output layer is zeroed, so those odds
  start even: a group of rollouts gets both rewards, and GRPO's advantages are not zero.

The test checks the rollouts' episodes and rewards, TRL's logged reward spread and advantages, that the updates
made the rewarded completion more likely and the unrewarded one less (their log-probabilities before and after
training, on the same prompt, screenshots and tokens), and that the screenshots went through the forward pass.
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

from engine.clients.gym_env import CoreThread  # noqa: E402
from engine.core.config import RunConfig  # noqa: E402
from engine.store.run_dir import read_records  # noqa: E402
from engine.tasks.loading import load_tasks  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from tests.conftest import subset  # noqa: E402
from tests.image_processor import ImageOnlyQwen3VLProcessor  # noqa: E402
from train.adapters import jpeg_to_pil  # noqa: E402
from train.adapters.trl import ENDED_TEXT, WebEnvironment, environment_factory, web_dataset  # noqa: E402

#: Rollouts of the task in the one GRPO group TRL generates. Each answers right at even odds (the untrained policy
#: is uniform), so the group gets a single reward with a chance of 2 / 2**GROUP (1 in 32768).
GROUP = 16
#: Optimizer steps, each on the whole group (GRPO's iterations per generation, TRL's ``num_iterations``).
STEPS = 2
#: The wrong answer: as many tokens as the task's (SPRING10), parting from it at the second letter, so that the
#: two replies are alike but for the code.
WRONG = "SUMMER20"


def tool_call(arguments: dict[str, Any]) -> str:
    """A ``computer_use`` call as Qwen writes it."""
    return '<tool_call>\n' + json.dumps({"name": "computer_use", "arguments": arguments}) + '\n</tool_call>'


def forced_replies(tokenizer: Any, script: list[tuple[str, str]]) -> list[list[Any]]:
    """``sequence_bias`` entries that make the model write ``reply`` right after ``context`` (each token biased
    only after the whole context and the reply's earlier tokens). Replies to the same context share their entries
    up to where they part; there each has its own entry with the same bias, so the model's own logits choose."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    entries: dict[tuple[int, ...], float] = {}
    for context, reply in script:
        anchor = tokenizer.encode(context, add_special_tokens=False)
        tokens = tokenizer.encode(reply, add_special_tokens=False) + [end]
        entries.update({tuple(anchor + tokens[: k + 1]): 1000.0 for k in range(len(tokens))})
    return [[list(key), bias] for key, bias in entries.items()]


def token_logps(trainer: GRPOTrainer, inputs: dict[str, Any]) -> torch.Tensor:
    """Per completion of a training batch and per token, the log-probability under the trainer's model now of
    the tokens the model wrote (0 at the tool answers and the padding), computed as GRPO's loss computes it: same
    sequences, same screenshots, same function."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    multimodal = {k: inputs.get(k) for k in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")}
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, inputs["completion_ids"].size(1), **multimodal)
    return logps * written(inputs)


def written(inputs: dict[str, Any]) -> torch.Tensor:
    """The mask of the tokens the model wrote in a training batch's completions (the loss's mask)."""
    return inputs["completion_mask"] * inputs["tool_mask"]


class RecordingGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` that keeps each batch its loss is computed on; the training itself is TRL's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.batches: list[dict[str, Any]] = []
        super().__init__(*args, **kwargs)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        self.batches.append(inputs)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_grpo_trainer_learns_from_web_rewards(tmp_path: Path) -> None:
    # TRL opens every rollout's episode before it generates: the core must hold a whole group at once.
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=GROUP, workers=1, telemetry=None)
    with CoreThread(cfg, serve_sites=True) as core:
        tasks = load_tasks(subset(tmp_path, per_site=1), core.base_url)[:1]
        right = tasks[0].definite_answer  # the task's check: the answer contains it
        assert right == "SPRING10", tasks[0]
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

        # After the first screenshot (the end of the user turn) a scroll; after the next one (the end of the tool
        # answer) the right or the wrong answer; after the episode's end (its text as the tool answer) an empty
        # reply, which ends the rollout.
        turn = "<|im_end|>\n<|im_start|>assistant\n"
        after_scroll = "<|vision_end|>\n</tool_response>" + turn
        bias = forced_replies(tokenizer, [
            ("<|vision_end|>" + turn, tool_call({"action": "scroll", "direction": "down"})),
            (after_scroll, tool_call({"action": "answer", "text": right})),
            (after_scroll, tool_call({"action": "answer", "text": WRONG})),
            (ENDED_TEXT + "\n</tool_response>" + turn, ""),
        ])
        args = GRPOConfig(
            output_dir=str(tmp_path / "trl"), max_steps=STEPS, num_iterations=STEPS, num_generations=GROUP,
            per_device_train_batch_size=GROUP, max_completion_length=256, max_tool_calling_iterations=3,
            learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, report_to="none", save_strategy="no",
            use_cpu=True, bf16=False, activation_checkpointing=False, generation_kwargs={"sequence_bias": bias},
            seed=0,
        )
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
        # The output layer zeroed, so that the untrained policy is uniform and the two answers have even odds where
        # they part: the tiny model's own output layer is large (for clear-cut greedy choices), which would make
        # one of them all but certain and the group's rewards all alike.
        with torch.no_grad():
            model.get_output_embeddings().weight.zero_()
        encoded: list[tuple[int, bool]] = []  # per pass of the vision tower: images encoded, under autograd?

        def count(_module: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            grid = kwargs["grid_thw"] if "grid_thw" in kwargs else inputs[1]
            encoded.append((len(grid), torch.is_grad_enabled()))

        model.model.visual.register_forward_pre_hook(count, with_kwargs=True)
        trainer = RecordingGRPOTrainer(model=model, args=args, processing_class=processor,
                                       train_dataset=web_dataset(tasks, viewport=core.core.cfg.worker),
                                       environment_factory=environment_factory(core, tasks))
        trainer.train()
        envs: list[WebEnvironment] = trainer._environment_pool[None]  # the instances TRL made and used

    # Each rollout was one engine episode: a scroll, then an answer that ended it, rewarded by the task's check.
    records = read_records(core.run_dir)  # type: ignore[arg-type]
    assert len(envs) == GROUP and len(records) == GROUP
    for record in records:
        assert record["task"]["task_id"] == tasks[0].task_id
        assert [s["action"]["name"] for s in record["steps"]] == ["scroll", "answer"]
        assert all(s["parse_error"] is None for s in record["steps"])
        outcome = (record["steps"][-1]["action"]["text"], record["status"], record["reward"]["value"])
        assert outcome in ((right, "success", 1.0), (WRONG, "failure", 0.0)), record

    # The group had both rewards: TRL logged their spread, every completion had a non-zero advantage, and each
    # step's loss had a gradient. All steps trained on the one generated batch.
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == STEPS and len(logs) == STEPS, trainer.state.log_history
    scored = logs[0]  # the step that generated, which TRL logs the rewards with
    assert scored["reward_std"] > 0 and scored["frac_reward_zero_std"] == 0.0, scored
    assert 0.0 < scored["rewards/WebEnvironment/mean"] < 1.0, scored
    assert scored["tools/call_frequency"] == 2.0 and scored["tools/failure_frequency"] == 0.0, scored
    assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 and m["entropy"] > 0 for m in logs), logs
    assert len(trainer.batches) == STEPS and all(b is trainer.batches[0] for b in trainer.batches)
    batch = trainer.batches[0]
    assert (batch["advantages"] != 0).all() and (batch["advantages"] > 0).any(), batch["advantages"]
    assert sorted(trainer._logs["advantages"]) == sorted(batch["advantages"].tolist())  # TRL's completions table

    # The updates moved the model towards the rewarded reply. On the group's completions (the same prompt,
    # screenshots and tokens; before training as TRL scored them when it generated, after training as its loss
    # would): the completion that answered right became more likely, the wrong one less likely, and where the two
    # answers part (the one token the model's odds chose) the odds of the right one rose from even.
    before, after = batch["old_per_token_logps"] * written(batch), token_logps(trainer, batch)
    up = batch["advantages"] > 0
    texts = tokenizer.batch_decode(batch["completion_ids"])
    assert all((right in text) == bool(rewarded) for text, rewarded in zip(texts, up, strict=True)), texts
    good, bad = int(up.nonzero()[0]), int((~up).nonzero()[0])
    part = int((batch["completion_ids"][good] != batch["completion_ids"][bad]).nonzero()[0])
    odds_before = (before[good, part] - before[bad, part]).exp().item()
    odds_after = (after[good, part] - after[bad, part]).exp().item()
    good_before, good_after = before[good].sum().item(), after[good].sum().item()
    bad_before, bad_after = before[bad].sum().item(), after[bad].sum().item()
    assert odds_before == pytest.approx(1.0) and odds_after > 1.5, (odds_before, odds_after)
    assert good_after > good_before + 1.0 and bad_after < bad_before - 1.0, (before.sum(1), after.sum(1))
    assert good_after - bad_after > good_before - bad_before + 2.0, (before.sum(1), after.sum(1))

    # The screenshots the episodes recorded are the images the model was given: the first page in the prompt,
    # the page after the scroll in the tool's answer, for every rollout, when generating and in the loss.
    frames = [np.asarray(jpeg_to_pil(Path(core.run_dir, s["screenshot"]).read_bytes()))  # type: ignore[arg-type]
              for r in records for s in r["steps"]]
    given = [np.asarray(image.convert("RGB")) for image in shown]
    assert len(frames) == 2 * GROUP and all(any(np.array_equal(f, g) for g in given) for f in frames)
    assert encoded.count((2 * GROUP, True)) == STEPS  # each step's loss encoded all the group's screenshots
