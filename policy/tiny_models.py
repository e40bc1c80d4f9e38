"""Tiny, randomly initialised Qwen-VL models (and a text-only Qwen2), built offline, for tests and benchmarks of the
model backends.

:func:`build_tiny_model` writes a complete Hugging Face model directory (config, safetensors weights,
generation config, a byte-level BPE tokenizer with the Qwen special tokens and a Qwen-style chat
template, and the image processor's ``preprocessor_config.json``) in well under a second, with no
network access. The architecture is the real one (Qwen2-VL, Qwen2.5-VL or Qwen3-VL: same classes, same
patch and merge sizes, same M-RoPE), only very small, so every code path of a backend runs as it would
with the released checkpoints. ``qwen2`` is a text-only language model (Qwen2's classes, no vision tower and no image
processor), for agents that read the accessibility tree instead of the screenshot. The replies are of course
gibberish.

Command line: ``python -m policy.tiny_models OUT_DIR --arch qwen3_vl``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The vision-language architectures :func:`build_tiny_model` knows.
ARCHS: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
#: The text-only ones (no vision tower, no image processor).
TEXT_ARCHS: tuple[str, ...] = ("qwen2",)

#: Qwen's special tokens (``special=True``: skipped by ``decode(skip_special_tokens=True)``).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
)
#: Qwen's added tokens that are ordinary text (``special=False``): they survive ``skip_special_tokens``,
#: as in the released tokenizers, so a reply's ``<tool_call>`` / ``<think>`` markup is kept.
TEXT_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<think>", "</think>")

#: A Qwen2-VL style chat template (no default system prompt, as in Qwen3-VL): each image part becomes
#: ``<|vision_start|><|image_pad|><|vision_end|>``; the backend expands the pad to the image's tokens.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# A few strings in the style of a web agent's prompts and replies, for the BPE merges.
_CORPUS = (
    "You are a web agent. Look at the screenshot and answer with one action.",
    "Task: find the cheapest laptop in the shop and add it to the cart.",
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [412, 88]}}\n'
    "</tool_call>",
    '<think>The search box is at the top of the page. I will type the query.</think>',
    '{"action": "type", "text": "wireless mouse"} {"action": "scroll", "direction": "down"}',
    "The page shows a list of products with prices: $19.99, $249.00, $1,099.",
    "Step 3 of 30. Previous action: click. The page changed. URL: http://127.0.0.1:8000/shop/cart",
    "answer: The flight from Berlin to Lisbon departs at 07:45 and costs 129 EUR.",
)

_OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _build_tokenizer(out_dir: Path, corpus: Sequence[str] = ()) -> dict[str, int]:
    """Train a byte-level BPE on :data:`_CORPUS` and ``corpus``, add the Qwen tokens, save it; return the token
    ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=640, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([*_CORPUS, *corpus], trainer=trainer)
    # The added tokens come after the BPE vocabulary in Qwen's order (<|endoftext|> = 151643 there).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
        model_max_length=32768, padding_side="left", clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out_dir)
    ids = {t: hf_tok.convert_tokens_to_ids(t) for t in (*SPECIAL_TOKENS, *TEXT_TOKENS)}
    ids["__len__"] = len(hf_tok)
    return ids


def _vision_config(arch: str, hidden: int) -> dict[str, Any]:
    if arch == "qwen2_vl":
        return {"depth": 2, "embed_dim": 32, "hidden_size": hidden, "mlp_ratio": 2, "num_heads": 2,
                "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                "hidden_act": "quick_gelu"}
    if arch == "qwen2_5_vl":
        # window_size 112 = 4 merged patches of 28 px, as in the released models; the last block is full attention.
        return {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
                "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": hidden,
                "window_size": 112, "fullatt_block_indexes": [1], "tokens_per_second": 2, "hidden_act": "silu"}
    # qwen3_vl: 16 px patches; a 16x16 table of learned position embeddings (interpolated to the grid);
    # one deepstack level (the released models have three, for 27 vision blocks).
    return {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
            "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": hidden,
            "num_position_embeddings": 256, "deepstack_visual_indexes": [0], "hidden_act": "gelu_pytorch_tanh"}


def build_tiny_model(
    out_dir: str | Path, arch: str = "qwen2_vl", seed: int = 0, *, hidden_size: int = 64, num_layers: int = 2,
    min_pixels: int | None = None, max_pixels: int | None = None, vision: dict[str, Any] | None = None,
    corpus: Sequence[str] = (),
) -> Path:
    """Write a tiny random ``arch`` model directory to ``out_dir`` (created if needed) and return its path.

    ``arch`` is one of :data:`ARCHS`. The weights are drawn with ``torch.manual_seed(seed)``, so a seed
    gives the same model every time. ``min_pixels``/``max_pixels`` go to the image processor's config;
    by default they are small (4 to 16 merged patches' worth of area: a 320x200 screenshot becomes about
    15 image tokens), so tests stay fast. Loadable with ``AutoModelForImageTextToText``,
    ``AutoTokenizer`` and :func:`policy.vision.load_vision_config`. ``vision`` overrides settings of the (tiny)
    vision tower's config, e.g. a released model's tower size for a benchmark. ``corpus``: more strings for the
    tokenizer's merges (the words of a task family, which a released tokenizer has as whole tokens).
    """
    if arch not in ARCHS + TEXT_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS + TEXT_ARCHS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = _build_tokenizer(out, corpus)
    vocab_size = (ids["__len__"] + 63) // 64 * 64  # padded like the released models' embedding tables

    heads = max(4, hidden_size // 128)  # head_dim 128 at larger sizes, as in the released models
    head_dim = hidden_size // heads
    text: dict[str, Any] = {
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers, "num_attention_heads": heads, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
    }
    half = head_dim // 2
    if arch == "qwen2":
        return _save_text_model(out, text, ids, seed)
    if arch == "qwen3_vl":
        from transformers import Qwen3VLConfig as ConfigCls
        from transformers import Qwen3VLForConditionalGeneration as ModelCls

        # Interleaved M-RoPE over head_dim/2 frequencies, T/H/W in the released models' proportions (24:20:20).
        text.update(head_dim=head_dim, rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                                                         "mrope_section": [half - 2 * (half // 4), half // 4,
                                                                           half // 4],
                                                         "mrope_interleaved": True})
        patch, mean, std = 16, [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
    else:
        if arch == "qwen2_vl":
            from transformers import Qwen2VLConfig as ConfigCls
            from transformers import Qwen2VLForConditionalGeneration as ModelCls
        else:
            from transformers import Qwen2_5_VLConfig as ConfigCls
            from transformers import Qwen2_5_VLForConditionalGeneration as ModelCls
        # M-RoPE sections (T, H, W) over head_dim/2 frequencies, as 16:24:24 in the released models.
        t_sec = half // 4
        text.update(rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                     "mrope_section": [t_sec, (half - t_sec) // 2, half - t_sec - (half - t_sec) // 2]})
        patch, mean, std = 14, _OPENAI_CLIP_MEAN, _OPENAI_CLIP_STD
    merge = 2
    factor = patch * merge
    min_px = min_pixels if min_pixels is not None else factor * factor * 4
    max_px = max_pixels if max_pixels is not None else factor * factor * 16

    config = ConfigCls(
        text_config=text, vision_config=_vision_config(arch, hidden_size) | (vision or {}),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    # Older transformers read these from the top level of the config.
    for key in ("vocab_size", "hidden_size", "bos_token_id", "eos_token_id", "pad_token_id"):
        if not hasattr(config, key) or getattr(config, key) is None:
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                setattr(config, key, text[key])

    _save_weights(ModelCls, config, out, ids, seed)

    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor" if arch == "qwen3_vl" else
        ("Qwen2_5_VLProcessor" if arch == "qwen2_5_vl" else "Qwen2VLProcessor"),
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": mean, "image_std": std, "resample": 3,
        "min_pixels": min_px, "max_pixels": max_px, "size": {"shortest_edge": min_px, "longest_edge": max_px},
        "patch_size": patch, "temporal_patch_size": 2, "merge_size": merge,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    return out


def _save_weights(model_cls: Any, config: Any, out: Path, ids: dict[str, int], seed: int) -> None:
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    # The default init (std 0.02) gives nearly flat next-token distributions; larger embeddings and output
    # weights make the random model's choices clear-cut, so greedy decoding is stable under tiny float noise.
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed + 1))
        model.get_output_embeddings().weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed + 2))
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"], do_sample=True, temperature=1.0, top_p=0.99,
    )
    model.save_pretrained(out, safe_serialization=True)


def _save_text_model(out: Path, text: dict[str, Any], ids: dict[str, int], seed: int) -> Path:
    """The text-only ``qwen2``: Qwen2's causal LM on the same tokenizer and chat template, no image processor."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**text, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                         tie_word_embeddings=False)
    _save_weights(Qwen2ForCausalLM, config, out, ids, seed)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m policy.tiny_models OUT_DIR [--arch ARCH] [--seed N]``."""
    parser = argparse.ArgumentParser(description="Write a tiny random Qwen-VL model directory (offline).")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--arch", choices=ARCHS + TEXT_ARCHS, default="qwen2_vl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--max-pixels", type=int, default=None)
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out_dir, args.arch, args.seed, hidden_size=args.hidden_size,
                            num_layers=args.layers, max_pixels=args.max_pixels)
    print(path)


if __name__ == "__main__":
    main()
