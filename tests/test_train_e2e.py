"""Behaviour cloning end to end (train/examples/bc_demo.py): the scripted policy solves three short bundled tasks
through the engine, its runs become demonstrations, a tiny random Qwen2-VL model that solves none of the tasks
(greedy, through the engine's ``hf`` backend) is trained on them with FBC, and the checkpoint the trainer wrote,
loaded by the ``hf`` backend, solves tasks it could not solve before.

The figures (success before and after, time of each phase) are printed; ``python -m train.examples.bc_demo``
runs the same with more steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from train.examples.bc_demo import TASKS, run_demo  # noqa: E402


@pytest.mark.timeout(900)
def test_behaviour_cloning_solves_tasks_the_untrained_model_cannot(tmp_path: Path) -> None:
    result = run_demo(tmp_path, tasks=TASKS, hidden_size=128, num_layers=2, max_steps=80, lr=2e-3)
    print("\n" + result.report())
    assert set(result.before) == set(result.after) == set(TASKS)
    assert result.success_before == 0.0, result.before  # a random model never answers correctly
    learnt = [t for t in TASKS if result.after[t] == 1.0 and result.before[t] != 1.0]
    assert learnt, result.report()
    assert result.final_token_acc > 0.95 and result.final_loss < 0.1
    # The trained model's episodes ran from the checkpoint directory the trainer wrote.
    assert (result.checkpoint / "model.safetensors").exists() and (result.checkpoint / "tokenizer.json").exists()
