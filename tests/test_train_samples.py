"""train.samples on a real engine run with the tiny Qwen3-VL model: every rebuilt prompt is the one the policy
saw (its sha256 equals the recorded one), the targets are the recorded tokens, batches have the documented
layout, images are decoded only when a batch is built, and the model's own log-probabilities at the label
positions equal the recorded behaviour log-probabilities (which proves the alignment end to end)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import train.samples as samples_mod  # noqa: E402
from engine.agent.model_api import ChatRequest, Generation, SamplingParams, image_refs  # noqa: E402
from engine.clients.runner import run  # noqa: E402
from engine.core.config import RunConfig  # noqa: E402
from engine.store.run_dir import read_records  # noqa: E402
from engine.tasks.schema import BUNDLED_TASKS  # noqa: E402
from policy.agent_policy import generation_details  # noqa: E402
from policy.hf_backend import HFModel  # noqa: E402
from policy.registry import BackendConfig, make_policy  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from train.behaviour import behaviour_temperature  # noqa: E402
from train.export import export_sharegpt  # noqa: E402
from train.logprobs import label_logprobs  # noqa: E402
from train.model_inputs import IGNORE_INDEX, model_wants_mm_token_types  # noqa: E402
from train.samples import (  # noqa: E402
    BatchStream,
    Collator,
    Processing,
    SampleError,
    bucket_batches,
    build_samples,
    full_prompt,
    samples_from_records,
)


def task_file(path: Path, task_ids: list[str]) -> Path:
    lines = [line for line in BUNDLED_TASKS.read_text().splitlines() if json.loads(line)["task_id"] in task_ids]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "qwen3_vl", "qwen3_vl")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, sites: str) -> Iterator[Path]:
    """Two bundled tasks (10 steps each: the tiny model never answers) with the hf backend, sampling at
    temperature 0.7 and top_p 0.9 (the recorded log-probs are the model's own distribution all the same)."""
    import asyncio

    tmp = tmp_path_factory.mktemp("hf-run")
    tasks = task_file(tmp / "tasks.jsonl", ["wiki-001", "travel-001"])
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp / "runs"), concurrency=2, workers=1, telemetry=None)
    policy = make_policy("hf", sampling=SamplingParams(max_tokens=8, seed=0, temperature=0.7, top_p=0.9),
                         backend=BackendConfig(model=str(tiny_model), device="cpu", max_batch=2))

    async def go() -> Path:
        _, run_dir = await run(cfg, policy, sites)
        return Path(run_dir)

    yield asyncio.run(go())


@pytest.fixture(scope="module")
def proc(tiny_model: Path) -> Processing:
    return Processing.load(tiny_model)


def all_steps(run_dir: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(r, s) for r in read_records(run_dir) for s in r["steps"]]


def test_rebuilt_prompts_and_targets_equal_the_recorded_ones(hf_run: Path, proc: Processing) -> None:
    steps = all_steps(hf_run)
    assert len(steps) >= 10 and all(s["parsed"]["prompt_sha256"] for _, s in steps)
    result = build_samples([hf_run], proc, on_mismatch="raise")
    assert len(result) == len(steps) and result.prompts_checked == len(steps) and not result.skipped
    by_key = {(s.episode_id, s.step): s for s in result}
    for record, step in steps:
        sample = by_key[(record["episode_id"], step["step"])]
        assert sample.prompt_sha256 == step["parsed"]["prompt_sha256"]
        assert sample.prompt_len == step["parsed"]["prompt_tokens"]
        assert sample.target_ids == step["token_ids"] and sample.target_source == "recorded"
        assert sample.behaviour_logprobs == step["logprobs"]
        assert (sample.logprobs_of, sample.logprobs_temperature, sample.logprobs_comparable) == ("model", 1.0, True)
        assert sample.labels[:sample.prompt_len] == [IGNORE_INDEX] * sample.prompt_len
        assert sample.labels[sample.prompt_len:] == step["token_ids"]
        assert sample.reward == record["reward"]["value"] and sample.policy_version == step["policy_version"]
        assert len(sample.images) == len(image_refs(step["messages"])) >= 1
        assert all(Path(p).is_file() and Path(p).is_relative_to(hf_run.resolve()) for p in sample.images)
        assert sample.input_ids.count(proc.image_token_id) == sum(sample.image_tokens)
    # The context window at work: later steps carry history rounds and their screenshots.
    assert max(len(s.images) for s in result) == 5


def test_mismatches_are_skipped_with_the_reason_or_raised(hf_run: Path, proc: Processing) -> None:
    records = read_records(hf_run)
    bad = copy.deepcopy(records[0])
    bad["steps"][0]["reply"] = bad["steps"][0]["reply"] + " edited"  # no longer what the tokens decode to
    bad["steps"][1]["messages"][0]["content"][0]["text"] += " (changed)"  # not the prompt the model saw
    bad["steps"][2].pop("messages")  # as a scripted step
    # An image from outside the run directory (a run directory may come from elsewhere): never read.
    [image] = [part for m in bad["steps"][3]["messages"] if isinstance(m["content"], list)
               for part in m["content"] if part.get("type") == "image"][:1]
    image["image"] = str((hf_run / image["image"]).resolve())
    result = samples_from_records(proc, [bad], hf_run)
    assert result.skipped == {"target mismatch": 1, "prompt mismatch": 1,
                              "no messages (not a model policy's step)": 1, "image": 1}
    assert len(result) == len(bad["steps"]) - 4
    with pytest.raises(SampleError, match="target mismatch"):
        samples_from_records(proc, [bad], hf_run, on_mismatch="raise")
    # A reply cut inside a character: vLLM's text withholds the incomplete bytes that the tokens end with.
    cut = copy.deepcopy(records[0])
    step = cut["steps"][0]
    ids = proc.tokenizer("click \u4e2d", add_special_tokens=False)["input_ids"]
    assert proc.tokenizer.decode(ids[:-1]) == "click \ufffd"  # the character's last byte is missing
    step.update(reply="click ", token_ids=ids[:-1], logprobs=[-1.0] * (len(ids) - 1))
    (sample,) = samples_from_records(proc, [{**cut, "steps": [step]}], hf_run, on_mismatch="raise").samples
    assert sample.target_ids == ids[:-1] and sample.target_source == "recorded"
    # Without recorded tokens the reply is tokenized and the end-of-turn token appended (no behaviour log-probs).
    plain = samples_from_records(proc, records[:1], hf_run, use_recorded_tokens=False).samples[0]
    assert plain.target_source == "reply" and plain.behaviour_logprobs is None
    assert plain.target_ids[-1] == proc.end_token_id == proc.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert proc.tokenizer.decode(plain.target_ids[:-1]) == records[0]["steps"][0]["reply"]
    # A selector picks steps and sets their loss weights.
    picked = samples_from_records(proc, records, hf_run, select=lambda i, r, s: 0.5 if s["step"] == 0 else None)
    assert len(picked) == len(records) and {s.weight for s in picked} == {0.5}


def test_collate_layout_and_lazy_images(hf_run: Path, proc: Processing, monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    real = samples_mod.preprocess_jpeg

    def counting(data: bytes, cfg: Any) -> Any:
        decoded.append(1)
        return real(data, cfg)

    monkeypatch.setattr(samples_mod, "preprocess_jpeg", counting)
    result = build_samples([hf_run], proc)
    stream = BatchStream(result.samples, Collator.for_processing(proc, mm_token_types=True), batch_size=3, window=4)
    plan = stream.plan()
    assert not decoded  # building samples and planning batches decode nothing
    batch = next(iter(stream))
    chosen = [result.samples[i] for i in plan[0]]
    assert len(decoded) == sum(len(s.images) for s in chosen)  # only this batch's images, when it is built

    n, width = len(chosen), max(len(s) for s in chosen)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["labels"].shape == (n, width)
    assert batch["attention_mask"].sum(1).tolist() == [len(s) for s in chosen]
    for row, s in enumerate(chosen):
        labels = batch["labels"][row]
        assert labels[:s.prompt_len].eq(IGNORE_INDEX).all() and labels[len(s):].eq(IGNORE_INDEX).all()
        assert labels[s.prompt_len:len(s)].tolist() == s.target_ids
        assert batch["input_ids"][row, len(s):].eq(proc.pad_token_id).all()
        # Behaviour log-probs sit at the label positions.
        assert batch["behaviour_logprobs"][row, s.prompt_len:len(s)].tolist() == pytest.approx(s.behaviour_logprobs)
        assert batch["behaviour_logprobs"][row][~batch["loss_mask"][row]].eq(0).all()
    assert batch["loss_mask"].sum().item() == sum(len(s.target_ids) for s in chosen)
    assert batch["has_behaviour"].all() and batch["advantages"].shape == batch["weights"].shape == (n,)
    assert batch["logprobs_temperature"].tolist() == [1.0] * n
    grid = batch["image_grid_thw"]
    assert grid.shape == (len(decoded), 3) and batch["pixel_values"].shape == (int(grid.prod(1).sum()),
                                                                            proc.vision.patch_dim)
    assert batch["mm_token_type_ids"].sum().item() == sum(sum(s.image_tokens) for s in chosen)
    assert len(list(stream)) == len(plan) == len(stream)


def test_model_log_probs_at_label_positions_equal_the_recorded_ones(hf_run: Path, proc: Processing,
                                                                    tiny_model: Path) -> None:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_model, dtype=torch.float32).eval()
    result = build_samples([hf_run], proc)
    longest = sorted(result.samples, key=len)[-2:]  # the most history, two prompt lengths (right padding)
    collate = Collator.for_processing(proc, mm_token_types=model_wants_mm_token_types(tiny_model))
    assert collate.mm_token_types == model_wants_mm_token_types(model)
    batch = collate(longest)
    # The trainer's own log-probs (train.trainer.label_logprobs) under the weights that sampled: they equal the
    # recorded behaviour log-probs although sampling used temperature 0.7 and top_p 0.9, so every importance
    # weight of an update starts at 1.
    with torch.no_grad():
        got, _, _, _ = label_logprobs(model, batch, "cpu")
    mask = batch["loss_mask"][:, 1:]
    want = batch["behaviour_logprobs"][:, 1:][mask]
    assert got.numel() == want.numel() == sum(len(s.target_ids) for s in longest)
    assert torch.allclose(got, want, atol=1e-3), (got - want).abs().max()
    assert torch.exp(got - want).sub(1).abs().max() < 1e-3  # w = exp(prox - behave) = 1
    records = [json.loads(line) for line in (hf_run / "episodes.jsonl").read_text().splitlines()]
    assert {s["parsed"]["logprobs_of"] for r in records for s in r["steps"]} == {"model"}



def test_each_row_leaves_the_vision_placeholders_out_as_its_recording_did(hf_run: Path, proc: Processing,
                                                                          tiny_model: Path) -> None:
    """An hf step (placeholders never sampled, left out of its log-probs) and a served one (vLLM's log-probs are
    over the whole vocabulary: ``parsed.logprobs_vision_masked`` false) in one batch: each row is taken its way."""
    from transformers import AutoModelForImageTextToText

    from policy.vision_tokens import vision_token_ids

    model = AutoModelForImageTextToText.from_pretrained(tiny_model, dtype=torch.float32).eval()
    hf_record, served = copy.deepcopy(read_records(hf_run)[:2])
    assert hf_record["steps"][0]["parsed"]["logprobs_vision_masked"] is True
    for step in served["steps"]:
        step["parsed"]["logprobs_vision_masked"] = False
    result = samples_from_records(proc, [hf_record, served], hf_run, on_mismatch="raise")
    rows_of = {False: [i for i, s in enumerate(result) if not s.logprobs_vision_masked],
               True: [i for i, s in enumerate(result) if s.logprobs_vision_masked]}
    assert len(rows_of[False]) == len(served["steps"]) and len(rows_of[True]) == len(hf_record["steps"])
    pair = [result.samples[rows_of[True][0]], result.samples[rows_of[False][0]]]
    batch = Collator.for_processing(proc, mm_token_types=model_wants_mm_token_types(model))(pair)
    assert batch["logprobs_vision_masked"].tolist() == [True, False]
    with torch.no_grad():
        got, targets, rows, logits = label_logprobs(model, batch, "cpu")
    vision = torch.tensor(vision_token_ids(model.config))
    full = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    masked = torch.log_softmax(logits.index_fill(-1, vision, float("-inf")), -1).gather(-1, targets[:, None])[:, 0]
    assert torch.equal(got[rows == 0], masked[rows == 0]) and torch.equal(got[rows == 1], full[rows == 1])
    assert (full - masked).abs().max() > 1e-4  # the placeholders carry mass: the two ways differ

def test_tempered_log_probs_of_the_hf_backend_equal_the_trainers(hf_run: Path, proc: Processing,
                                                                  tiny_model: Path) -> None:
    """The hf backend standing in for SGLang's default (log-probs after the temperature, before top-p): at
    temperature 0.7 and top_p 0.9 the recorded log-probs are log_softmax(logits / 0.7), and the trainer's at the
    sample's temperature equal them, so every importance weight of an update starts at 1 here too."""
    import asyncio

    records = read_records(hf_run)
    chosen = [(r, r["steps"][-1]) for r in records]  # the most history
    sampling = SamplingParams(max_tokens=8, seed=0, temperature=0.7, top_p=0.9)
    requests = []
    for record, step in chosen:
        messages = full_prompt(record, step)
        images = {ref: (hf_run / ref).read_bytes() for ref in image_refs(messages)}
        requests.append(ChatRequest(f"{record['episode_id']}/{step['step']}", messages, images, sampling))

    async def generate() -> tuple[list[Generation], Generation, Any]:
        backend = HFModel(tiny_model, device="cpu", dtype="float32", max_batch=2, logprobs_of="temperature")
        await backend.start()
        try:
            gens = await asyncio.gather(*[backend.generate(r) for r in requests])
            greedy = await backend.generate(ChatRequest("greedy", requests[0].messages, requests[0].images,
                                                        SamplingParams(temperature=0.0, max_tokens=2)))
            return list(gens), greedy, backend.model
        finally:
            await backend.close()

    gens, greedy, model = asyncio.run(generate())
    assert {g.logprobs_of for g in gens} == {"temperature"} and greedy.logprobs_of == "model"  # no T to divide by
    edited = []
    for (record, step), gen in zip(chosen, gens, strict=True):
        rec, st = copy.deepcopy(record), copy.deepcopy(step)
        st.update(reply=gen.text, token_ids=gen.token_ids, logprobs=gen.logprobs)
        st["parsed"] = {**st["parsed"], **generation_details(gen, sampling)}
        assert st["parsed"]["logprobs_temperature"] == 0.7 and gen.prompt_sha256 == step["parsed"]["prompt_sha256"]
        rec["steps"] = [st]
        edited.append(rec)
    result = samples_from_records(proc, edited, hf_run, on_mismatch="raise")
    assert [(s.logprobs_of, s.logprobs_temperature, s.logprobs_comparable) for s in result] == [
        ("temperature", pytest.approx(0.7), True)] * 2
    batch = Collator.for_processing(proc, mm_token_types=model_wants_mm_token_types(model))(result.samples)
    with torch.no_grad():
        got, _, _, _ = label_logprobs(model, batch, "cpu", batch["logprobs_temperature"])
        plain, _, _, _ = label_logprobs(model, batch, "cpu")
    want = batch["behaviour_logprobs"][:, 1:][batch["loss_mask"][:, 1:]]
    assert got.numel() == want.numel() == sum(len(s.target_ids) for s in result)
    assert torch.allclose(got, want, atol=1e-3), (got - want).abs().max()
    assert (plain - want).abs().max() > 1e-2  # the model's own distribution is another one


@pytest.mark.parametrize(("parsed", "expected"), [
    ({"logprobs_of": "model"}, (1.0, True)),
    ({"logprobs_of": "temperature", "logprobs_temperature": 0.7}, (0.7, True)),
    ({"logprobs_of": "temperature", "logprobs_temperature": 2}, (2.0, True)),
    ({"logprobs_of": "temperature"}, (1.0, False)),
    ({"logprobs_of": "temperature", "logprobs_temperature": 0.0}, (1.0, False)),  # greedy: no tempered distribution
    ({"logprobs_of": "temperature", "logprobs_temperature": float("inf")}, (1.0, False)),
    ({"logprobs_of": "temperature", "logprobs_temperature": float("nan")}, (1.0, False)),
    ({"logprobs_of": "temperature", "logprobs_temperature": True}, (1.0, False)),
    ({"logprobs_of": "temperature", "logprobs_temperature": "0.7"}, (1.0, False)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None}}, (1.0, True)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 1, "top_k": -1, "min_p": 0.0}}, (1.0, True)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 0.7, "top_p": 1.0}}, (1.0, False)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 1.0, "top_p": 0.9}}, (1.0, False)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 1.0, "top_k": 50}}, (1.0, False)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"temperature": 1.0, "min_p": 0.05}}, (1.0, False)),
    ({"logprobs_of": "sampler", "logprobs_sampling": {"top_p": 1.0}}, (1.0, False)),
    ({"logprobs_of": "sampler"}, (1.0, False)),  # the settings are not recorded: nothing proves no truncation
    ({"logprobs_of": None}, (1.0, False)),
    ({"logprobs_of": "processed_logprobs"}, (1.0, False)),
    ({}, (1.0, False)),
    (None, (1.0, False)),
])
def test_logprobs_of_gives_the_samples_temperature_and_comparability(parsed: dict[str, Any] | None,
                                                                     expected: tuple[float, bool]) -> None:
    assert behaviour_temperature(parsed) == expected


@pytest.mark.parametrize(("kind", "expected"), [("model", (1.0, True)), ("temperature", (0.7, True)),
                                                ("sampler", (1.0, False)), (None, (1.0, False))])
def test_recorded_generation_details_give_the_samples_distribution(kind: str | None,
                                                                   expected: tuple[float, bool]) -> None:
    """What the agent policy records for a reply (parsed) is what sample building reads back."""
    sampling = SamplingParams(temperature=0.7, top_p=0.9)
    details = generation_details(Generation("x", [1], [-0.5], logprobs_of=kind), sampling)
    assert details["logprobs_of"] == kind
    assert ("logprobs_temperature" in details) == (kind == "temperature")
    assert ("logprobs_sampling" in details) == (kind == "sampler")
    assert behaviour_temperature(details) == expected
    at_one = generation_details(Generation("x", logprobs_of=kind), SamplingParams(temperature=1.0, top_p=1.0))
    assert behaviour_temperature(at_one)[1] == (kind is not None)  # untruncated sampling: every kind compares


def test_bucket_batches() -> None:
    lengths = [50, 10, 40, 20, 30, 60, 70, 5, 15, 25]
    batches = bucket_batches(lengths, batch_size=3, window=2, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(10))
    assert all(1 <= len(b) <= 3 for b in batches)
    for b in batches:  # sorted inside a window: a batch is a run of neighbours in length
        assert [lengths[i] for i in b] == sorted(lengths[i] for i in b)
    capped = bucket_batches(lengths, batch_size=4, window=10, max_tokens=100, shuffle=False)
    assert all(len(b) * max(lengths[i] for i in b) <= 100 or len(b) == 1 for b in capped)
    assert [len(b) for b in capped] == [4, 2, 2, 1, 1]  # 5,10,15,20 | 25,30 | 40,50 | 60 | 70
    again, other = bucket_batches(lengths, 3, seed=1), bucket_batches(lengths, 3, seed=2)
    assert bucket_batches(lengths, 3, seed=1) == again != other


def test_export_of_a_model_run(hf_run: Path, tmp_path: Path) -> None:
    steps = all_steps(hf_run)
    out = tmp_path / "sft.json"
    result = export_sharegpt(hf_run, out, only_success=False)
    data = json.loads(out.read_text())
    assert result["samples"] == len(data) == len(steps)
    for sample, (record, step) in zip(data, steps, strict=True):
        conv = sample["conversations"]
        assert [c["from"] for c in conv] == ["human", "gpt"] * (len(conv) // 2)
        assert conv[-1]["value"] == step["reply"] and sample["system"] == record["system_prompt"]
        placeholders = sum(c["value"].count("<image>") for c in conv)
        assert placeholders == len(sample["images"]) == len(image_refs(step["messages"]))
        assert all(Path(p).is_absolute() and Path(p).is_file() for p in sample["images"])
        assert conv[0]["value"].startswith("Task: " + record["task"]["task_name"])
    # The tiny model solves nothing: by default (successful episodes only) nothing is exported.
    assert export_sharegpt(hf_run, tmp_path / "none.jsonl")["skipped"] == {"not successful": len(read_records(hf_run))}


@pytest.mark.parametrize("size", [(1280, 768), (800, 600), (375, 812), (64, 64), (2560, 1440)])
def test_image_token_count_from_the_header_equals_the_decoded_image(proc: Processing, size: tuple[int, int]) -> None:
    import numpy as np

    from engine import _imgcodec as codec
    from policy.vision import preprocess_jpeg

    width, height = size
    jpeg = codec.encode(np.full((height, width, 3), 128, dtype=np.uint8))
    assert proc.image_tokens(jpeg[:2048]) == preprocess_jpeg(jpeg, proc.vision).num_tokens
