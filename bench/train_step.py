"""A timed training step of a full-size Qwen2.5-VL-3B-shaped model (random weights): the vision tower's attention
and MLP as transformers runs them and as the trainer does, with and without activation checkpointing.

    python -m bench.train_step [--batch 1 4] [--seq 2048] [--images 2] [--steps 4] [--vision-attention both]
        [--vision-mlp both] [--checkpointing off vision on] [--compile off all] [--profile]
        [--json docs/benchmarks/train_step.json]

The architecture is built in code (no download, nothing written to disk) directly on the GPU, in bfloat16 (float32
with ``--precision autocast``): text model 2048 wide, 36 layers, 16 heads, 2 KV heads, MLP 11008, vocabulary
151,936; vision tower 32 blocks, 1280 wide, output 2048, patch 14, merge 2, window 112, full attention in blocks
7/15/23/31. The synthetic batch: ``--batch`` sequences of ``--seq`` tokens, each with ``--images`` screenshots
(``--image-size``, 1008x616 by default: 792 LLM tokens each) and a ``--reply``-token target at the end. One step is
the trainer's own forward (:func:`train.logprobs.label_logprobs`: logits only at the label positions, log-softmax in
float32), the FBC token-mean NLL, backward, gradient clipping and an AdamW step. ``--precision bf16`` (the default)
keeps parameters and optimiser state in bf16, so that a 3.75B-parameter model fits one 80 GB GPU; ``--precision
autocast`` is the trainer's own: float32 parameters and optimiser state, the forward under bf16 autocast.

Every combination of ``--batch``, ``--vision-attention`` (``varlen``: one call per block for all windows and images,
the trainer's default; ``default``: transformers' loop, one call per window or image; ``both``), ``--vision-mlp``
(``aligned``: the MLP's 3,420-wide intermediate padded to 3,424, :mod:`policy.vision_mlp`; ``default``; ``both``),
``--checkpointing`` (``off``, ``vision``: the tower's blocks only, ``on``: every layer) and ``--compile`` (``off``;
``vision``: the tower's blocks through ``torch.compile``; ``all``: those and the language model's layers,
:mod:`policy.compiled_blocks`) is timed on the same model; a compiled setting's warm-up steps take its compile time,
which is printed apart. Printed per setting: seconds per step, tokens/s, model-FLOP utilisation, peak GPU memory
(allocated and reserved); a setting that runs out of memory says so. Model FLOPs (:func:`step_flops`) are
the usual 6 x parameters x tokens of every matrix product each token or patch goes through (the language model's
layers for every token, the vision blocks for every patch, the merger for every image token, the vocabulary
projection for the label positions only, as the trainer computes it) plus the attention products (causal in the
language model, per window or per image in the tower); a checkpointed recompute is not counted. Utilisation
divides by the chip's dense bf16 peak (:data:`PEAK_BF16_TFLOPS`, or ``--peak-tflops``). ``--profile`` adds a
PyTorch profile of two more steps of each setting: kernels launched per step, the GPU's busy time, the busiest
kernels. ``--json`` stores it all (``bench.report`` convention) for ``bench.publish``, rewritten after every
setting, so that a run cut short keeps what it measured.

Without a CUDA GPU it prints a message and exits (status 0); ``--tiny --device cpu`` runs the same code on a
tiny model of the same architecture, to check it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from policy.compiled_blocks import COMPILE_MODES, check_backend

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


#: Dense bf16 peaks of the chips this is run on, in TFLOP/s (the vendors' datasheets, without sparsity).
PEAK_BF16_TFLOPS: dict[str, float] = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1}


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name`` (e.g. "NVIDIA H200"), or None when not known."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


def _numel(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def window_sizes(grid_h: int, grid_w: int, merge: int, window: int) -> list[int]:
    """Patches per attention window of one image in Qwen2.5-VL's windowed blocks: the merged grid cut into tiles of
    ``window`` merged tokens a side from the top left (edge tiles smaller), ``merge**2`` patches per merged token."""
    mh, mw = grid_h // merge, grid_w // merge
    rows = [min(window, mh - r) for r in range(0, mh, window)]
    cols = [min(window, mw - c) for c in range(0, mw, window)]
    return [r * c * merge * merge for r in rows for c in cols]


def step_flops(model: Any, batch: int, seq: int, images: int, height: int, width: int, reply: int) -> float:
    """Model FLOPs of one training step (forward and backward: 3 x the forward's 2 x multiply-adds), counted as the
    module docstring says, from the model's own parameter counts and configuration."""
    config = model.config
    text, vision = config.text_config, config.vision_config
    lm = model.model.language_model
    tower = model.model.visual
    patch, merge = vision.patch_size, vision.spatial_merge_size
    grid_h, grid_w = height // patch, width // patch
    patches = grid_h * grid_w  # per image
    merged = patches // (merge * merge)
    n_images = batch * images
    dense = (_numel(lm.layers) * batch * seq + _numel(tower.blocks) * n_images * patches
             + _numel(tower.merger) * n_images * merged + text.hidden_size * text.vocab_size * batch * reply)
    # Attention: QK^T and AV, 2 x 2 x q x k x width forward each; the language model's is causal (half).
    lm_attn = 4 * text.num_hidden_layers * batch * (seq * seq / 2) * text.num_attention_heads * (
        text.hidden_size // text.num_attention_heads)
    full = set(getattr(vision, "fullatt_block_indexes", None) or range(vision.depth))
    win = getattr(vision, "window_size", 0) // (patch * merge)
    per_image_windowed = sum(w * w for w in window_sizes(grid_h, grid_w, merge, win)) if win else patches * patches
    vision_attn = 4 * vision.hidden_size * n_images * (len(full) * patches * patches
                                                       + (vision.depth - len(full)) * per_image_windowed)
    return 3 * (2 * dense + lm_attn + vision_attn)


def time_steps(model: Any, batch: dict[str, Any], device: Any, steps: int, warmup: int, profile: bool = False,
               autocast: bool = False) -> tuple[float, float, float | None, float | None, dict[str, Any] | None]:
    """Mean seconds per training step (after ``warmup`` steps), the seconds of the first step (a compiled
    setting's compile time is in it), the peak GPU memory allocated and reserved in GiB (None off a GPU) and
    (``profile``) what a PyTorch profile of two more steps shows. ``autocast``: the forward under bf16 autocast,
    as the trainer runs it."""
    import torch

    from train.logprobs import label_logprobs

    params = [p for p in model.parameters() if p.requires_grad]
    cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=cuda)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logp, _, _, _ = label_logprobs(model, batch, device)
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(warmup + max(1, steps)):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    first, times = times[0], times[warmup:]
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    reserved = torch.cuda.max_memory_reserved(device) / 2**30 if cuda else None
    found = profile_steps(step, device, 2) if profile else None
    return sum(times) / len(times), first, peak, reserved, found


def profile_steps(step: Any, device: Any, steps: int, top: int = 12) -> dict[str, Any]:
    """Kernels launched per step, GPU time against wall time, and the ``top`` kernels by GPU time, over ``steps``
    steps under the PyTorch profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    # GPU events less user annotations (the optimizer's step range), which lie over their own kernels.
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]
    gpu_us = sum(e.device_time for e in kernels)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time)
    busiest = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"steps": steps, "wall_ms_per_step": round(wall * 1000 / steps, 1),
            "kernels_per_step": round(len(kernels) / steps),
            "gpu_busy_ms_per_step": round(gpu_us / 1000 / steps, 1),
            "top_kernels": [{"name": name[:120], "ms_per_step": round(sum(t) / 1000 / steps, 2),
                             "calls_per_step": round(len(t) / steps, 1)} for name, t in busiest]}


#: The settings a row compares, in the order its name gives them.
SETTING_KEYS: tuple[str, ...] = ("vision_attention", "vision_mlp", "checkpointing", "compile")

#: The speed-ups printed and stored: (setting, after, before), every other setting equal.
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("vision_attention", "varlen", "default"), ("vision_mlp", "aligned", "default"),
    ("compile", "vision", "off"), ("compile", "all", "off"))


def _setting_name(r: dict[str, Any], seq: int, leave_out: str | None = None) -> str:
    words = [f"{k.replace('vision_', '')} {r[k]}" for k in SETTING_KEYS if k != leave_out]
    return f"{r['batch']} x {seq:,}, " + ", ".join(words)


def summary_rows(results: list[dict[str, Any]], seq: int) -> list[dict[str, Any]]:
    """The headline rows: each setting's tokens/s, utilisation and memory, then the speed-ups of
    :data:`COMPARISONS`. The goals (8,000 tokens/s and 35% utilisation on an H200; a peak under an 80 GB GPU's
    memory with the tower checkpointed) are marked on the fastest varlen setting of each batch size without
    checkpointing, and of each batch size above one with the tower checkpointed (the setting that fits 80 GB)."""
    from bench.report import row

    fastest: dict[tuple[int, str], dict[str, Any]] = {}
    for r in results:
        setting = (r["batch"], r["checkpointing"])
        if r["vision_attention"] == "varlen" and r["tokens_per_s"] and (
                setting not in fastest or r["tokens_per_s"] > fastest[setting]["tokens_per_s"]):
            fastest[setting] = r
    rows = []
    for r in results:
        if r["tokens_per_s"] is None:
            continue
        name = _setting_name(r, seq)
        best = fastest.get((r["batch"], r["checkpointing"])) is r
        fits = best and r["batch"] > 1 and r["checkpointing"] == "vision"
        goal = best and (r["checkpointing"] == "off" or fits)
        rows.append(row(f"{name}: tokens/s", r["tokens_per_s"], "tokens/s",
                        ">= 8,000 (H200)" if goal else None, r["tokens_per_s"] >= 8000 if goal else None))
        if r["mfu"] is not None:
            rows.append(row(f"{name}: model-FLOP utilisation", 100 * r["mfu"], "%", ">= 35" if goal else None,
                            r["mfu"] >= 0.35 if goal else None))
        if r["peak_reserved_gib"] is not None:
            rows.append(row(f"{name}: peak memory reserved", r["peak_reserved_gib"], "GiB",
                            "fits an H100 80GB (79.6 GiB): <= 79 GiB" if fits else None,
                            r["peak_reserved_gib"] <= 79 if fits else None))
    for key, after, before in COMPARISONS:
        for r in results:
            if r[key] != after or r["tokens_per_s"] is None:
                continue
            base = next((b for b in results if b[key] == before and b["tokens_per_s"] and b["batch"] == r["batch"]
                         and all(b[k] == r[k] for k in SETTING_KEYS if k != key)), None)
            if base:
                rows.append(row(f"{_setting_name(r, seq, leave_out=key)}: {key.replace('vision_', '')} {after} / "
                                f"{before} tokens/s", r["tokens_per_s"] / base["tokens_per_s"], "x"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Timed training step of a Qwen2.5-VL-3B-shaped model.")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="sequences per step (each is timed)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--images", type=int, default=2, help="screenshots per sequence")
    parser.add_argument("--image-size", default="1008x616", help="WIDTHxHEIGHT, multiples of 28")
    parser.add_argument("--reply", type=int, default=256, help="target tokens per sequence")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture (a CPU check)")
    parser.add_argument("--checkpointing", nargs="+", choices=("off", "vision", "on"), default=["off", "vision", "on"],
                        help="activation checkpointing: none, the vision tower's blocks only, every layer")
    parser.add_argument("--vision-attention", choices=("varlen", "default", "both"), default="both",
                        help="the vision tower's attention: varlen (one call per block), default (transformers' "
                             "loop over windows and images), or both, to compare them in one run")
    parser.add_argument("--vision-mlp", choices=("aligned", "default", "both"), default="both",
                        help="the vision MLP: aligned (intermediate width padded to a multiple of 8, "
                             "policy.vision_mlp) or default (transformers' own), or both")
    parser.add_argument("--compile", nargs="+", choices=COMPILE_MODES, default=["off"],
                        help="torch.compile of the vision tower's blocks (vision) and the language model's layers "
                             "too (all), or none (off): each one given is timed")
    parser.add_argument("--precision", choices=("bf16", "autocast"), default="bf16",
                        help="bf16 parameters and optimiser state, or the trainer's float32 ones with the forward "
                             "under bf16 autocast")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend for --compile (aot_eager: graphs captured, no kernels generated; "
                             "a quick check of the code on a CPU)")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                        help="torch.compile's mode for --compile (reduce-overhead: each compiled graph replayed as a "
                             "CUDA graph)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the chip's dense bf16 peak (default: known "
                        "chips' datasheet figure)")
    parser.add_argument("--profile", action="store_true", help="profile two more steps of every setting")
    parser.add_argument("--json", type=Path, default=None, help="store the results here (bench.report convention)")
    args = parser.parse_args(argv)
    if any(mode != "off" for mode in args.compile):
        try:
            check_backend(args.compile_backend)  # once, not as every compiled setting's recorded failure
        except ValueError as exc:
            parser.error(str(exc))

    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench.train_step: no CUDA GPU here; nothing to measure (run it on a GPU machine, or check the code "
              "with --tiny --device cpu).")
        return 0
    from transformers import Qwen2_5_VLForConditionalGeneration

    from policy.compiled_blocks import set_compiled_blocks
    from policy.vision_attention import set_vision_attention
    from policy.vision_mlp import set_vision_mlp
    from train.model_inputs import model_wants_mm_token_types
    from train.model_io import set_checkpointing

    width, height = (int(x) for x in args.image_size.lower().split("x"))
    dtype = torch.bfloat16 if device.type == "cuda" and args.precision == "bf16" else torch.float32
    t0 = time.perf_counter()
    config = qwen25_vl_3b_config(args.tiny)
    with device:
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = args.peak_tflops or (peak_tflops(name) if device.type == "cuda" else None)
    print(f"Qwen2.5-VL-3B architecture{' (tiny)' if args.tiny else ''}: {n_params / 1e9:.2f}B parameters, "
          f"{dtype}, built on {name} in {time.perf_counter() - t0:.1f} s; bf16 peak "
          f"{f'{peak:g} TFLOP/s' if peak else 'unknown (no utilisation printed)'}")
    per_image = (height // 28) * (width // 28)
    wants_types = model_wants_mm_token_types(model)
    checkpointing_value: dict[str, bool | str] = {"off": False, "vision": "vision", "on": True}
    vision_settings = ["default", "varlen"] if args.vision_attention == "both" else [args.vision_attention]
    mlp_settings = ["default", "aligned"] if args.vision_mlp == "both" else [args.vision_mlp]
    results: list[dict[str, Any]] = []
    config_out = vars(args) | {"json": None, "device_name": name, "peak_bf16_tflops": peak, "parameters": n_params}
    for n in args.batch:
        batch = synthetic_batch(n, args.seq, args.images, height, width, args.reply, mm_token_types=wants_types)
        flops = step_flops(model, n, args.seq, args.images, height, width, args.reply)
        print(f"batch: {n} x {args.seq} tokens, {args.images} screenshots of {width}x{height} ({per_image} tokens "
              f"each) per sequence, {args.reply} target tokens per sequence; {flops / 1e12:.1f} TFLOP per step")
        for vision, mlp, ckpt, compiled in itertools.product(vision_settings, mlp_settings, args.checkpointing,
                                                             args.compile):
            setting = {"batch": n, "vision_attention": vision, "implementation": set_vision_attention(model, vision),
                       "vision_mlp": mlp, "mlps_padded": set_vision_mlp(model, mlp), "checkpointing": ckpt,
                       "compile": compiled}
            set_checkpointing(model, checkpointing_value[ckpt])
            # After checkpointing, which decides how a block is compiled.
            setting["blocks_compiled"] = set_compiled_blocks(model, compiled, backend=args.compile_backend,
                                                             compile_mode=args.compile_mode)
            results.append(measure(model, batch, device, setting, n * args.seq, flops, peak, args))
            if args.json:
                store(args.json, config_out, results, args.seq)
    for r in summary_rows(results, args.seq):
        if r["unit"] == "x":
            print(f"{r['figure']}: {r['value']:.2f}x")
    if args.json:
        print(f"stored in {args.json}")
    return 0


def measure(model: Any, batch: dict[str, Any], device: Any, setting: dict[str, Any], tokens: int, flops: float,
            peak: float | None, args: argparse.Namespace) -> dict[str, Any]:
    """Time one setting (already applied to ``model``), print it, and return it with its figures."""
    import torch

    label = (f"  vision attention {setting['vision_attention']} ({setting['implementation']}), MLP "
             f"{setting['vision_mlp']} ({setting['mlps_padded']} padded), checkpointing {setting['checkpointing']:>6}, "
             f"compile {setting['compile']} ({setting['blocks_compiled']} blocks)")
    found = setting | {"step_s": None, "first_step_s": None, "tokens_per_s": None, "mfu": None,
                       "peak_allocated_gib": None, "peak_reserved_gib": None, "out_of_memory": False, "error": None}
    try:
        step_s, first_s, allocated, reserved, prof = time_steps(model, batch, device, args.steps, args.warmup,
                                                                profile=args.profile,
                                                                autocast=args.precision == "autocast")
    except torch.OutOfMemoryError:
        print(f"{label}: out of GPU memory")
        found["out_of_memory"] = True
    except Exception as exc:  # a setting that fails (a compile error, say) is recorded; the others still run
        traceback.print_exc()
        print(f"{label}: failed: {exc!r}")
        found["error"] = repr(exc)[:500]
    else:
        mfu = flops / step_s / (peak * 1e12) if peak else None
        found.update(step_s=round(step_s, 4), first_step_s=round(first_s, 2), tokens_per_s=round(tokens / step_s, 1),
                     mfu=round(mfu, 4) if mfu is not None else None,
                     peak_allocated_gib=allocated and round(allocated, 2),
                     peak_reserved_gib=reserved and round(reserved, 2))
        memory = f", peak memory {allocated:.1f} GiB allocated, {reserved:.1f} GiB reserved" if (
            allocated is not None and reserved is not None) else ""
        print(f"{label}: {step_s:.3f} s/step, {tokens / step_s:,.0f} tokens/s"
              f"{f', {100 * mfu:.1f}% MFU' if mfu is not None else ''}{memory}; first step {first_s:.1f} s")
        if prof:
            found["profile"] = prof
            print(f"    profile: {prof['kernels_per_step']} kernels per step, GPU busy "
                  f"{prof['gpu_busy_ms_per_step']} of {prof['wall_ms_per_step']} ms")
            for k in prof["top_kernels"]:
                print(f"      {k['ms_per_step']:8.2f} ms {k['calls_per_step']:7.1f} calls  {k['name']}")
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
    return found


def store(path: Path, config: dict[str, Any], results: list[dict[str, Any]], seq: int) -> None:
    """Write the results so far (``bench.report`` convention)."""
    from bench.report import write_result

    write_result(path, "train_step", config, summary_rows(results, seq), [], [], settings=results)


if __name__ == "__main__":
    sys.exit(main())
