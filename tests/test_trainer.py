"""The trainer (train/trainer.py) and its configuration (train/config.py) on a tiny random Qwen2-VL model.

A synthetic model-policy run (four one-step episodes of two tasks, screenshots and all) stands in for a real
one, so that each test runs a few optimizer steps in seconds: one FBC and one GRPO step lower the loss on a
fixed batch, gradient accumulation equals one larger batch, the checkpoint loads in the ``hf`` backend and
generates, and a 2-process FSDP2 run (gloo, CPU) through ``torchrun`` and the ``train-model`` command ends at
the same weights as one process with the same global batch.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from train.config import ConfigError, TrainConfig

EXAMPLE_TOML = """
model_dir = "/models/qwen3-vl"
output_dir = "out"
algorithm = "grpo"
lr = 5e-6
betas = [0.9, 0.95]
warmup_steps = 3
schedule = "constant"
max_steps = 40
batch_size = 2
grad_accum = 4
bf16 = "auto"
gradient_checkpointing = true
dual_clip = false

[agent]
response_format = "vanilla"
window = 2
"""


# ---------------------------------------------------------------------------------------------- config


def test_config_from_toml_yaml_and_json(tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    path.write_text(EXAMPLE_TOML)
    cfg = TrainConfig.load(path)
    assert (cfg.algorithm, cfg.lr, cfg.betas, cfg.max_steps, cfg.total_batch) == ("grpo", 5e-6, (0.9, 0.95), 40, 8)
    assert cfg.dual_clip is None and cfg.is_cap == 5.0 and cfg.gradient_checkpointing is True
    assert cfg.agent.response_format == "vanilla" and cfg.agent.window == 2
    assert TrainConfig.load(path, lr=1e-4, max_steps=None).lr == 1e-4  # overrides; None keeps the file's
    yaml_path = tmp_path / "train.yaml"
    yaml_path.write_text("model_dir: m\nlr: 1e-6\nbf16: false\nagent:\n  window: 0\n")
    cfg = TrainConfig.load(yaml_path)
    assert (cfg.lr, cfg.bf16, cfg.agent.window) == (1e-6, False, 0)
    json_path = tmp_path / "train.json"
    json_path.write_text(json.dumps({**cfg.to_dict(), "agent": {"window": 1}}))
    assert TrainConfig.load(json_path).agent.window == 1


@pytest.mark.parametrize(("text", "message"), [
    ('model_dir = "m"\nlearning_rate = 1e-5', "unknown key 'learning_rate'"),
    ('model_dir = "m"\nbatchsize = 2', "did you mean 'batch_size'"),
    ('model_dir = "m"\nalgorithm = "ppo"', "algorithm: must be one of fbc, grpo"),
    ('model_dir = "m"\nlr = "fast"', "lr: expected a number"),
    ('model_dir = "m"\nlr = -1.0', "lr: must be > 0"),
    ('model_dir = "m"\nbatch_size = 1.5', "batch_size: expected an integer"),
    ('model_dir = "m"\nbf16 = "maybe"', "bf16: must be"),
    ('model_dir = "m"\nvision_mlp = "padded"', "vision_mlp: must be one of aligned, default"),
    ('model_dir = "m"\ncompile_blocks = "yes"', "compile_blocks: must be one of off, vision, all"),
    ('model_dir = "m"\ncompile_backend = ""', "compile_backend: must name a torch.compile backend"),
    ('model_dir = "m"\ngradient_checkpointing = "text"', "gradient_checkpointing: must be one of true, false, vision"),
    ('model_dir = "m"\nbetas = [0.9]', "betas: expected a list of 2 values"),
    ('model_dir = "m"\nschedule = "linear"', "schedule: must be one of cosine, constant"),
    ('model_dir = "m"\n[agent]\nwindows = 2', "unknown key 'agent.windows'"),
    ('model_dir = "m"\n[agent]\nresponse_format = "short"', "agent.response_format: must be one of complete, vanilla"),
    ('lr = 1e-5', "model_dir is required"),
    ('model_dir = "m"\nlr = ', "invalid TOML"),
])
def test_config_errors_name_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="bad.toml") as exc:
        TrainConfig.load(path)
    assert message in str(exc.value)


@pytest.mark.parametrize("name", ["fbc.toml", "grpo.toml"])
def test_example_configs_load(name: str) -> None:
    cfg = TrainConfig.load(Path(__file__).resolve().parents[1] / "train" / "examples" / name)
    assert cfg.algorithm == name.split(".")[0] and cfg.gradient_checkpointing


def test_config_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "train.ini"
    path.write_text("x")
    with pytest.raises(ConfigError, match="unknown config format"):
        TrainConfig.load(path)


def test_schedule_values() -> None:
    from train.schedule import lr_factor

    # Linear warm-up over 4 steps, then cosine from 1 to 0.1 at step 14.
    got = [lr_factor(s, 4, 14, "cosine", 0.1) for s in range(15)]
    assert got[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert got[4] == pytest.approx(1.0) and got[9] == pytest.approx(0.55) and got[14] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(got[4:], got[5:], strict=False))
    assert [lr_factor(s, 2, 10, "constant") for s in range(5)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])
    assert lr_factor(100, 0, 10, "cosine") == pytest.approx(0.0)  # stays at the floor past the end


# ---------------------------------------------------------------------------------------------- a tiny model

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    # On a small shared CPU, one intra-op thread is many times faster for these tiny models.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from policy.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "qwen2_vl", "qwen2_vl")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A model-policy run of four one-step episodes: tasks t0 and t1, each solved once and failed once; episodes
    e0 and e1 recorded their generated token ids and log-probs (e0 under the model's own distribution, e1 at
    temperature 0.7, as SGLang reports them), e2 and e3 only the reply."""
    import numpy as np

    from engine import _imgcodec as codec
    from policy.prompting import load_tokenizer

    tok = load_tokenizer(tiny_model)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    run = tmp_path_factory.mktemp("run")
    (run / "frames").mkdir()
    records = []
    for i in range(4):
        rng = np.random.default_rng(i)
        (run / "frames" / f"{i}.jpg").write_bytes(codec.encode(rng.integers(0, 255, (200, 320, 3), dtype=np.uint8)))
        reply = (f'Action: answer\n<tool_call>\n{{"name": "computer_use", "arguments": {{"action": "answer", '
                 f'"text": "{"x" * (3 + 5 * i)}"}}}}\n</tool_call>')
        step: dict[str, Any] = {
            "step": 0, "reply": reply, "page_changed": True, "action": {"name": "answer", "text": "x"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": f"Task: task {i % 2}" + "!" * i},
                                                      {"type": "image", "image": f"frames/{i}.jpg"}]}]}
        if i < 2:
            ids = [*tok(reply, add_special_tokens=False)["input_ids"], end]
            step["token_ids"], step["logprobs"] = ids, [-1.0] * len(ids)
            step["parsed"] = {"logprobs_of": "model"} if i == 0 else {"logprobs_of": "temperature",
                                                                       "logprobs_temperature": 0.7}
        records.append({"episode_id": f"e{i}", "task": {"task_id": f"t{i % 2}", "task_name": f"task {i % 2}"},
                        "system_prompt": "You are a web agent.", "status": "success" if i < 2 else "failure",
                        "reward": {"value": 1.0 if i < 2 else 0.0}, "steps": [step]})
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def config(model: Path, out: Path, **kw: Any) -> TrainConfig:
    kw = {"lr": 1e-3, "max_steps": 1, "batch_size": 4, "progress": False, "plots": False, "tensorboard": False,
          "max_grad_norm": 0.0, "device": "cpu", **kw}
    return TrainConfig(model_dir=str(model), output_dir=str(out), **kw)


def params(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.parametrize("algorithm", ["fbc", "grpo"])
def test_one_step_changes_the_weights_and_lowers_the_loss(tmp_path: Path, tiny_model: Path, run_dir: Path,
                                                          algorithm: str) -> None:
    from train.trainer import Trainer, samples_from_runs

    cfg = config(tiny_model, tmp_path, algorithm=algorithm)
    samples = samples_from_runs(cfg, [run_dir])
    if algorithm == "fbc":  # the successful episodes only
        assert sorted(s.episode_id for s in samples) == ["e0", "e1"]
    else:  # every episode, with its group-normalised advantage / k
        assert sorted((s.episode_id, round(s.advantage, 3)) for s in samples) == [
            ("e0", 0.1), ("e1", 0.1), ("e2", -0.1), ("e3", -0.1)]
        assert sum(s.behaviour_logprobs is not None for s in samples) == 2
    trainer = Trainer(cfg, samples)
    if algorithm == "grpo":
        trainer.compute_proximal()
        assert trainer.prox is not None and [len(p) for p in trainer.prox] == [len(s.target_ids) for s in samples]
    micro = [list(range(len(samples)))]
    before, weights = trainer.loss_on(micro), params(trainer.model)
    stats = trainer.optimizer_step(micro)
    after = trainer.loss_on(micro)
    assert stats["loss"] == pytest.approx(before, rel=1e-4, abs=1e-6)  # the step's loss is the pre-update loss
    assert after < before, (before, after)
    changed = [k for k, v in params(trainer.model).items() if not torch.equal(v, weights[k])]
    assert len(changed) > 0.8 * len(weights)
    m = trainer.metrics(1, 0, stats, 1.0, 1.0)
    assert m["target_tokens"] == sum(len(s.target_ids) for s in samples) and math.isfinite(m["grad_norm"])
    if algorithm == "grpo":
        # e0/e1 recorded behaviour log-probs of -1: their importance weights are exp(prox + 1), the others' 1.
        assert trainer.prox is not None
        w = [math.exp(p - b) for s, prox in zip(samples, trainer.prox, strict=True)
             for p, b in zip(prox, s.behaviour_logprobs or prox, strict=True)]
        kept = [x for x in w if x <= cfg.is_cap]  # type: ignore[operator]
        assert m["kept_tokens"] == len(kept) and m["dropped_frac"] == 1 - len(kept) / len(w)
        assert m["mean_is_weight"] == pytest.approx(sum(kept) / len(kept), rel=1e-4) != pytest.approx(1.0)
        assert m["mean_ratio"] == pytest.approx(1.0, abs=1e-4)  # before the update theta == prox
    else:
        assert 0 <= m["token_acc"] <= 1 and m["nll"] == pytest.approx(before, rel=1e-4)


def relabelled_run(tmp_path: Path, run_dir: Path, parsed: dict[str, Any] | None) -> Path:
    """``run_dir`` with e0's ``parsed`` details replaced (None: removed); the frames are shared."""
    records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    records[0]["steps"][0].pop("parsed", None)
    if parsed is not None:
        records[0]["steps"][0]["parsed"] = parsed
    out = tmp_path / "run"
    out.mkdir(parents=True)
    (out / "frames").symlink_to(run_dir / "frames")
    (out / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


@pytest.mark.parametrize("parsed", [
    {"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": None}},
    {"logprobs_of": "sampler"},  # no sampling settings: nothing proves there was no truncation
    {"logprobs_of": None},
    None,  # a record from before logprobs_of, or a backend that does not say
], ids=["sampler-truncated", "sampler-unknown", "none", "missing"])
def test_grpo_refuses_behaviour_logprobs_it_cannot_reproduce(tmp_path: Path, tiny_model: Path, run_dir: Path,
                                                             parsed: dict[str, Any] | None) -> None:
    from train.trainer import Trainer, samples_from_runs

    cfg = config(tiny_model, tmp_path, algorithm="grpo")
    samples = samples_from_runs(cfg, [relabelled_run(tmp_path, run_dir, parsed)])
    with pytest.raises(ValueError, match=r"grpo: 1 of 4 samples have behaviour log-probs the trainer cannot "
                                         r"reproduce") as exc:
        Trainer(cfg, samples, model=object())  # refused before the model is even looked at
    message = str(exc.value)
    kind = (parsed or {}).get("logprobs_of")
    assert ("'sampler'" if kind else "None (the backend does not say)") in message
    assert "episode e0 step 0" in message and "raw_logprobs" in message and "temperature 1" in message


def test_grpo_accepts_untruncated_sampler_logprobs_and_fbc_any(tmp_path: Path, tiny_model: Path,
                                                               run_dir: Path) -> None:
    from train.trainer import Trainer, samples_from_runs

    untruncated = {"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}}
    cfg = config(tiny_model, tmp_path, algorithm="grpo")
    samples = samples_from_runs(cfg, [relabelled_run(tmp_path, run_dir, untruncated)])
    assert [(s.logprobs_of, s.logprobs_temperature, s.logprobs_comparable) for s in samples.samples[:2]] == [
        ("sampler", 1.0, True), ("temperature", 0.7, True)]
    assert Trainer(cfg, samples).prox is None
    # FBC's loss never reads the behaviour log-probs: it trains on steps of any backend.
    fbc = config(tiny_model, tmp_path / "fbc", algorithm="fbc")
    Trainer(fbc, samples_from_runs(fbc, [relabelled_run(tmp_path / "fbc", run_dir, None)]))


def test_grpo_takes_each_sample_at_its_recorded_temperature(tmp_path: Path, tiny_model: Path, run_dir: Path) -> None:
    """The proximal log-probs of e1 (recorded at temperature 0.7) are log_softmax(logits / 0.7), e0's the model's
    own, in one batch; FBC's are the model's own for every row."""
    from train.logprobs import label_logprobs
    from train.trainer import Trainer, samples_from_runs

    cfg = config(tiny_model, tmp_path, algorithm="grpo")
    samples = samples_from_runs(cfg, [run_dir])
    trainer = Trainer(cfg, samples)
    batch = trainer.collate(samples.samples)
    assert batch["logprobs_temperature"].tolist() == pytest.approx([1.0, 0.7, 1.0, 1.0])
    trainer.compute_proximal()
    assert trainer.prox is not None
    trainer.model.eval()
    with torch.no_grad():
        for i, s in enumerate(samples.samples[:2]):
            one = trainer.collate([s])
            tempered = label_logprobs(trainer.model, one, "cpu", s.logprobs_temperature)[0]
            plain = label_logprobs(trainer.model, one, "cpu")[0]
            assert torch.allclose(torch.tensor(trainer.prox[i]), tempered, atol=1e-5), s.episode_id
            assert torch.allclose(tempered, plain, atol=1e-5) == (s.logprobs_temperature == 1.0), s.episode_id
        assert trainer._temperature(batch) is batch["logprobs_temperature"]
        trainer.cfg = config(tiny_model, tmp_path, algorithm="fbc")
        assert trainer._temperature(batch) is None


@pytest.mark.parametrize("algorithm", ["fbc", "grpo"])
def test_gradient_accumulation_equals_one_larger_batch(tmp_path: Path, tiny_model: Path, run_dir: Path,
                                                       algorithm: str) -> None:
    from train.trainer import Trainer, samples_from_runs

    cfg = config(tiny_model, tmp_path, algorithm=algorithm)
    samples = samples_from_runs(cfg, [run_dir]).samples[:2]
    assert len(samples[0]) != len(samples[1])  # padding in the big batch
    grads, losses = [], []
    for micro in ([[0, 1]], [[0], [1]]):
        torch.manual_seed(0)
        trainer = Trainer(config(tiny_model, tmp_path, algorithm=algorithm, batch_size=len(micro[0]),
                                 grad_accum=len(micro)), samples)
        if algorithm == "grpo":
            trainer.compute_proximal()
        losses.append(trainer.optimizer_step(micro)["loss"])
        grads.append({k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-7)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6), k


@pytest.mark.parametrize("algorithm", ["fbc", "grpo"])
def test_packed_step_equals_padded_step(tmp_path: Path, tiny_model: Path, run_dir: Path, algorithm: str) -> None:
    """Sequence packing (train/packing.py): one row without padding, the same loss and gradients."""
    from train.plan import micro_batches
    from train.trainer import Trainer, samples_from_runs

    samples = samples_from_runs(config(tiny_model, tmp_path, algorithm=algorithm), [run_dir]).samples
    assert len({len(s) for s in samples}) > 1  # padding in the padded batch
    grads, losses = [], []
    for packing in (False, True):
        torch.manual_seed(0)
        trainer = Trainer(config(tiny_model, tmp_path, algorithm=algorithm, packing=packing), samples)
        if algorithm == "grpo":
            trainer.compute_proximal()
        stats = trainer.optimizer_step([list(range(len(samples)))])
        assert stats["tokens"] == sum(len(s) for s in samples)
        losses.append(stats["loss"])
        grads.append({k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-7)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6), k
    lengths = [len(s) for s in samples]
    budget = max(lengths) + min(lengths)
    micro = micro_batches(lengths, config(tiny_model, tmp_path, packing=True, max_tokens=budget), shuffle=True,
                          seed=0)
    assert sorted(i for mb in micro for i in mb) == list(range(len(samples)))
    assert all(sum(lengths[i] for i in mb) <= budget for mb in micro) and max(map(len, micro)) > 1


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path: Path, tiny_model: Path, run_dir: Path) -> None:
    from train.trainer import Trainer, samples_from_runs

    samples = samples_from_runs(config(tiny_model, tmp_path), [run_dir]).samples
    grads = []
    for checkpointing in (False, True, "vision"):
        trainer = Trainer(config(tiny_model, tmp_path, gradient_checkpointing=checkpointing), samples)
        trainer.optimizer_step([[0, 1]])
        layers = trainer.model.model.language_model.layers
        blocks = trainer.model.model.visual.blocks
        assert all(getattr(layer, "gradient_checkpointing", False) == (checkpointing is True) for layer in layers)
        assert all(getattr(block, "gradient_checkpointing", False) == bool(checkpointing) for block in blocks)
        grads.append({k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None})
    for other in grads[1:]:
        assert other.keys() == grads[0].keys()
        for k in grads[0]:
            assert torch.allclose(grads[0][k], other[k], rtol=1e-4, atol=1e-6), k


def test_compiled_blocks_train_like_eager_ones_on_micro_batches_of_changing_length(tmp_path: Path, tiny_model: Path,
                                                                                   run_dir: Path) -> None:
    """``compile_blocks = "all"``: each step's loss equals the eager trainer's, and once lengths and batch sizes have
    varied, the compiled graphs stop growing (TorchDynamo marks the changing sizes dynamic), so a long run never
    reaches the recompile limit, past which TorchDynamo would quietly run the blocks eagerly. The graphs are
    captured with the ``eager`` backend: shapes, guards and recompiles are TorchDynamo's whatever the backend."""
    import torch._dynamo

    from train.trainer import Trainer, samples_from_runs

    samples = samples_from_runs(config(tiny_model, tmp_path, algorithm="grpo"), [run_dir]).samples
    assert len({len(s) for s in samples}) == 4
    warm_up, later = [[0], [1], [0, 1], [2]], [[3], [1, 2], [2, 3], [0, 3]]  # new lengths and pairs after warm-up
    losses: dict[str, list[float]] = {}
    for blocks in ("off", "all"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        trainer = Trainer(config(tiny_model, tmp_path, algorithm="grpo", compile_blocks=blocks,
                                 compile_backend="eager"), samples)
        trainer.compute_proximal()
        losses[blocks] = [trainer.optimizer_step([mb])["loss"] for mb in warm_up]
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        losses[blocks] += [trainer.optimizer_step([mb])["loss"] for mb in later]
        if blocks == "all":
            assert graphs > 0 and torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()
    assert losses["all"] == pytest.approx(losses["off"], rel=1e-5, abs=1e-7)
    with pytest.raises(ValueError, match="'inductr' is not a torch.compile backend"):  # before the model loads
        Trainer(config(tiny_model, tmp_path, compile_blocks="all", compile_backend="inductr"), samples)


def test_train_writes_checkpoints_metrics_and_plots_and_the_checkpoint_generates(
        tmp_path: Path, tiny_model: Path, run_dir: Path) -> None:
    from engine.agent.model_api import ChatRequest, SamplingParams
    from policy.hf_backend import HFModel
    from train.trainer import samples_from_runs, train

    cfg = config(tiny_model, tmp_path / "out", max_steps=3, save_every=2, batch_size=1, warmup_steps=1, plots=True,
                 tensorboard=True)
    result = train(cfg, samples_from_runs(cfg, [run_dir]))
    assert result.steps == 3 and math.isfinite(result.final_loss) and result.tokens_per_s > 0
    assert result.checkpoints == [tmp_path / "out" / "checkpoint-2", tmp_path / "out" / "final"]
    lines = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "token_acc", "reward"} <= set(lines[0])
    assert [m["lr"] for m in lines] == pytest.approx([5e-4, 1e-3, 5e-4])  # warm-up, then the cosine
    assert (tmp_path / "out" / "loss.png").stat().st_size > 1000 and (tmp_path / "out" / "reward.png").exists()
    with_tensorboard = True
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:  # optional: the trainer skips it quietly
        with_tensorboard = False
    assert any((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*")) == with_tensorboard
    final = result.checkpoint
    assert final is not None
    names = {p.name for p in final.iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert json.loads((final / "config.json").read_text())["architectures"] == ["Qwen2VLForConditionalGeneration"]

    async def generate() -> str:
        model = HFModel(final, device="cpu")
        await model.start()
        try:
            messages = [{"role": "user", "content": [{"type": "text", "text": "Task: task 0"},
                                                     {"type": "image", "image": "frames/0.jpg"}]}]
            request = ChatRequest("r0", messages, {"frames/0.jpg": (run_dir / "frames" / "0.jpg").read_bytes()},
                                  SamplingParams(temperature=0.0, max_tokens=6))
            return (await model.generate(request)).text
        finally:
            await model.close()

    assert isinstance(asyncio.run(generate()), str)


def test_train_model_command_and_a_two_process_fsdp_run_agree(tmp_path: Path, tiny_model: Path,
                                                              run_dir: Path) -> None:
    """The same global batch (2 samples per step) as one process with grad_accum 2 and as two FSDP2 ranks (gloo,
    CPU) with one micro-batch each: the same losses and, after two AdamW steps, the same weights."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from train.cli import train_model

    base = (f'model_dir = "{tiny_model}"\nalgorithm = "grpo"\nlr = 1e-3\nmax_steps = 2\nbatch_size = 1\n'
            'progress = false\nplots = false\ncpu_threads = 1\nmax_grad_norm = 1.0\n')
    (tmp_path / "one.toml").write_text(base + f'output_dir = "{tmp_path / "one"}"\ngrad_accum = 2\n')
    (tmp_path / "two.toml").write_text(base + f'output_dir = "{tmp_path / "two"}"\ngrad_accum = 1\n')
    result = CliRunner().invoke(train_model, [str(tmp_path / "one.toml"), "--runs", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "grpo: 4 samples" in result.output and "2 steps" in result.output
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "train.cli", "train-model", str(tmp_path / "two.toml"), "--runs", str(run_dir)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "on 2 process(es)" in proc.stdout
    one = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    two = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [m["loss"] for m in one] == pytest.approx([m["loss"] for m in two], rel=1e-4, abs=1e-6)
    assert [m["tokens"] for m in one] == [m["tokens"] for m in two]
    a = load_file(tmp_path / "one" / "final" / "model.safetensors")
    b = load_file(tmp_path / "two" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), k
