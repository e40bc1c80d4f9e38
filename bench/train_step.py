"""A timed training step of a full-size Qwen2.5-VL-3B-shaped model (random weights), with and without gradient
checkpointing.

    python -m bench.train_step [--batch 4] [--seq 2048] [--images 2] [--steps 5] [--vision-attention both]

The architecture is built in code (no download, nothing written to disk) directly on the GPU in bfloat16: text
model 2048 wide, 36 layers, 16 heads, 2 KV heads, MLP 11008, vocabulary 151,936; vision tower 32 blocks, 1280
wide, output 2048, patch 14, merge 2, window 112, full attention in blocks 7/15/23/31. The synthetic batch:
``--batch`` sequences of ``--seq`` tokens, each with ``--images`` screenshots (``--image-size``, 1008x616 by
default: 792 LLM tokens each) and a ``--reply``-token target at the end. One step is the trainer's own forward
(:func:`train.trainer.label_logprobs`: logits only at the label positions, log-softmax in float32), the FBC
token-mean NLL, backward, gradient clipping and an AdamW step (bf16 parameters and optimiser state, so that a
3.75B-parameter model fits one 80 GB GPU; the trainer itself keeps float32 master weights). Printed per setting:
seconds per step, tokens/s, peak GPU memory; a setting that runs out of memory says so. ``--vision-attention``
picks the vision tower's attention (:mod:`policy.vision_attention`): ``varlen`` (the trainer's default: one call
per block for all windows and images), ``default`` (transformers' loop, one call per window or image), or
``both``, which times each on the same model and batch and prints the ratio.

Without a CUDA GPU it prints a message and exits (status 0); ``--tiny --device cpu`` runs the same code on a
tiny model of the same architecture, to check it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from typing import Any

IMAGE_TOKEN, VISION_START, VISION_END, VIDEO_TOKEN = 151655, 151652, 151653, 151656


def qwen25_vl_3b_config(tiny: bool = False) -> Any:
    """The Qwen2.5-VL-3B architecture (``tiny``: the same, 64 wide and 2 layers deep, for a CPU check)."""
    from transformers import Qwen2_5_VLConfig

    text = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
            "bos_token_id": 151643, "eos_token_id": 151645}
    vision = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_channels": 3,
              "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
              "hidden_act": "silu"}
    if tiny:
        text.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]})
        vision.update(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      fullatt_block_indexes=[1])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
                            video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
                            vision_end_token_id=VISION_END, tie_word_embeddings=True)


def synthetic_batch(batch: int, seq: int, images: int, height: int, width: int, reply: int, seed: int = 0,
                    mm_token_types: bool = True) -> dict[str, Any]:
    """``batch`` rows of ``seq`` tokens: text, ``images`` screenshots (vision start, pads, vision end), more text,
    then a ``reply``-token target (the labels); pixel values drawn at random."""
    import torch

    if height % 28 or width % 28:
        raise ValueError("--image-size must be multiples of 28 (patch 14 x merge 2)")
    per_image = (height // 28) * (width // 28)
    patches = (height // 14) * (width // 14)
    text = seq - images * (per_image + 2) - reply
    if text < 2 * images + 2:
        raise ValueError(f"{images} images of {per_image} tokens and a {reply}-token reply do not fit {seq} tokens")
    g = torch.Generator().manual_seed(seed)
    rows = []
    chunk = text // (images + 1)
    for _ in range(batch):
        ids: list[int] = []
        for _ in range(images):
            ids += torch.randint(0, 150000, (chunk,), generator=g).tolist()
            ids += [VISION_START] + [IMAGE_TOKEN] * per_image + [VISION_END]
        ids += torch.randint(0, 150000, (seq - reply - len(ids),), generator=g).tolist()
        ids += torch.randint(0, 150000, (reply,), generator=g).tolist()
        rows.append(ids)
    input_ids = torch.tensor(rows, dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    labels[:, seq - reply:] = input_ids[:, seq - reply:]
    out = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels,
           "pixel_values": torch.randn(batch * images * patches, 3 * 2 * 14 * 14, generator=g),
           "image_grid_thw": torch.tensor([[1, height // 14, width // 14]] * (batch * images), dtype=torch.long)}
    if mm_token_types:
        out["mm_token_type_ids"] = (input_ids == IMAGE_TOKEN).to(torch.int32)
    return out


def time_steps(model: Any, batch: dict[str, Any], device: Any, steps: int, warmup: int) -> tuple[float, float]:
    """Mean seconds per training step (after ``warmup`` steps) and the peak GPU memory in GiB."""
    import torch

    from train.logprobs import label_logprobs

    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=fused)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        logp, _, _, _ = label_logprobs(model, batch, device)
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
    del optimizer
    return sum(times) / len(times), peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Timed training step of a Qwen2.5-VL-3B-shaped model.")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--images", type=int, default=2, help="screenshots per sequence")
    parser.add_argument("--image-size", default="1008x616", help="WIDTHxHEIGHT, multiples of 28")
    parser.add_argument("--reply", type=int, default=256, help="target tokens per sequence")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture (a CPU check)")
    parser.add_argument("--checkpointing", choices=("both", "on", "off"), default="both")
    parser.add_argument("--vision-attention", choices=("varlen", "default", "both"), default="varlen",
                        help="the vision tower's attention: varlen (one call per block), default (transformers' "
                             "loop over windows and images), or both, to compare them in one run")
    args = parser.parse_args(argv)

    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench.train_step: no CUDA GPU here; nothing to measure (run it on a GPU machine, or check the code "
              "with --tiny --device cpu).")
        return 0
    from transformers import Qwen2_5_VLForConditionalGeneration

    from policy.vision_attention import set_vision_attention
    from train.model_io import set_checkpointing
    from train.samples import model_wants_mm_token_types

    width, height = (int(x) for x in args.image_size.lower().split("x"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    config = qwen25_vl_3b_config(args.tiny)
    with device:
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"Qwen2.5-VL-3B architecture{' (tiny)' if args.tiny else ''}: {n_params / 1e9:.2f}B parameters, "
          f"{dtype}, built on {name} in {time.perf_counter() - t0:.1f} s")
    batch = synthetic_batch(args.batch, args.seq, args.images, height, width, args.reply,
                            mm_token_types=model_wants_mm_token_types(model))
    per_image = (height // 28) * (width // 28)
    print(f"batch: {args.batch} x {args.seq} tokens, {args.images} screenshots of {width}x{height} "
          f"({per_image} tokens each) per sequence, {args.reply} target tokens per sequence")
    checkpointing_settings = {"both": [False, True], "on": [True], "off": [False]}[args.checkpointing]
    vision_settings = ["default", "varlen"] if args.vision_attention == "both" else [args.vision_attention]
    tokens = args.batch * args.seq
    results: dict[tuple[str, bool], float | None] = {}
    for vision in vision_settings:
        used = set_vision_attention(model, vision)
        for checkpointing in checkpointing_settings:
            set_checkpointing(model, checkpointing)
            label = f"vision attention {vision} ({used}), gradient checkpointing {'on ' if checkpointing else 'off'}"
            try:
                step_s, peak = time_steps(model, batch, device, args.steps, args.warmup)
            except torch.OutOfMemoryError:
                print(f"{label}: out of GPU memory")
                results[vision, checkpointing] = None
            else:
                results[vision, checkpointing] = tokens / step_s
                print(f"{label}: {step_s:.3f} s/step, {tokens / step_s:,.0f} tokens/s, peak memory {peak:.1f} GiB")
            model.zero_grad(set_to_none=True)
            gc.collect()
            if device.type == "cuda":
                with contextlib.suppress(Exception):
                    torch.cuda.empty_cache()
    for vision in vision_settings:
        with_ckpt, without = results.get((vision, True)), results.get((vision, False))
        if with_ckpt and without:
            print(f"vision attention {vision}: checkpointing costs {without / with_ckpt:.2f}x in speed")
    for checkpointing in checkpointing_settings:
        before, after = results.get(("default", checkpointing)), results.get(("varlen", checkpointing))
        if before and after:
            print(f"checkpointing {'on' if checkpointing else 'off'}: varlen vision attention is "
                  f"{after / before:.2f}x the default's tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
