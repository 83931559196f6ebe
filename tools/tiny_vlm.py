"""Write a Qwen2-VL model directory (tiny, 2B- or 7B-sized) that vLLM loads with no downloads.

    python tools/tiny_vlm.py OUT_DIR [--random-weights] [--seed N]
    python tools/tiny_vlm.py OUT_DIR --shape 7b    # or --shape 2b

Without --random-weights the directory holds config, tokenizer and preprocessor only; start the
engine with ``load_format="dummy"``. With --random-weights it also holds real random weights
(``Qwen2VLForConditionalGeneration(config).save_pretrained``, safetensors, bf16), so generated
tokens depend on the image embeddings and the default ``load_format`` works.

Shapes (``--shape``; all use the same tiny tokenizer and text vocab 512, so every id decodes):

- ``tiny`` (default): hidden 128, 2 layers, 2 heads / 1 KV head (head_dim 64); vision depth 1,
  embed_dim 64, patch 14, merge 2. Images are resized into [56², 112²] pixels: a 100×80 image
  gives a 6×8 patch grid, i.e. 12 image tokens (a 12×128 bf16 encoder output).
- ``7b``: Qwen2-VL-7B's text and vision shapes (hidden 3584, intermediate 18944, 28 layers,
  28 heads / 4 KV heads, rope_theta 1e6, mrope_section [16, 24, 24]; vision depth 32,
  embed_dim 1280, 16 heads, mlp_ratio 4, merged into 3584) and its pixel bounds
  [3136, 12845056]: an 896×672 image gives 32×24 = 768 image tokens (768×3584 bf16, 5.5 MB).
  Config only (about 13.6 GiB of bf16 weights when vLLM makes dummy ones); --random-weights is
  refused for it.
- ``2b``: Qwen2-VL-2B's text shapes (hidden 1536, intermediate 8960, 28 layers, 12 heads / 2 KV
  heads) with the very same vision encoder and pixel bounds as ``7b`` (merged into 1536): the
  encoder is a larger share of a request. An 896×672 image gives 768×1536 bf16 (2.4 MB). Config
  only, as ``7b``.

Needs ``tokenizers`` (always) and ``torch`` + ``transformers`` (for --random-weights): run it with
the vLLM venv's python (``.venv-vllm/bin/python``, see tools/setup_vllm_env.sh).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",  # 0: bos / pad / unk
    "<|im_start|>",  # 1
    "<|im_end|>",  # 2: eos
    "<|vision_start|>",  # 3
    "<|vision_end|>",  # 4
    "<|vision_pad|>",  # 5
    "<|image_pad|>",  # 6
    "<|video_pad|>",  # 7
]
TOKEN_ID = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
TOKENIZER_VOCAB_SIZE = 400
TEXT_VOCAB_SIZE = 512
MAX_POSITIONS = 2048
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112


@dataclass(frozen=True)
class Shape:
    """The sizes that differ between the model shapes this tool writes."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    mrope_section: tuple[int, int, int]
    vision_depth: int
    vision_embed_dim: int
    vision_heads: int
    vision_mlp_ratio: int
    min_pixels: int
    max_pixels: int
    max_positions: int


SHAPES = {
    "tiny": Shape(
        hidden=128,
        intermediate=256,
        layers=2,
        heads=2,
        kv_heads=1,  # head_dim 64: supported by the CPU attention backend
        mrope_section=(8, 12, 12),
        vision_depth=1,
        vision_embed_dim=64,
        vision_heads=2,
        vision_mlp_ratio=2,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        max_positions=MAX_POSITIONS,
    ),
    # Qwen2-VL-7B-Instruct's config.json and preprocessor_config.json, vocabulary aside.
    "7b": Shape(
        hidden=3584,
        intermediate=18944,
        layers=28,
        heads=28,
        kv_heads=4,
        mrope_section=(16, 24, 24),
        vision_depth=32,
        vision_embed_dim=1280,
        vision_heads=16,
        vision_mlp_ratio=4,
        min_pixels=3136,
        max_pixels=12845056,
        max_positions=32768,
    ),
    # Qwen2-VL-2B-Instruct's: the 7B's vision tower and pixel bounds, a 1.5B language model.
    "2b": Shape(
        hidden=1536,
        intermediate=8960,
        layers=28,
        heads=12,
        kv_heads=2,
        mrope_section=(16, 24, 24),
        vision_depth=32,
        vision_embed_dim=1280,
        vision_heads=16,
        vision_mlp_ratio=4,
        min_pixels=3136,
        max_pixels=12845056,
        max_positions=32768,
    ),
}

# Qwen2's pre-tokenizer split (same as transformers' Qwen2Tokenizer).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2-VL-Instruct's chat template (image/video parts become vision placeholders).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "You are a helpful assistant.",
    "Describe this image. What is in the picture? Answer in one short sentence.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm red mat.",
    "A photo of a small house, a tree, a car on the road and a blue sky with white clouds.",
    "user assistant system image video text color shape size left right top bottom",
    "Hello, world! 0123456789 (a, b, c); [x: y] {key = value} - + * / = ? ! . , ' \"",
    "the of and to in is it that for on with as was at by this be are from or an have not",
]


def config_dict(shape: str = "tiny") -> dict:
    """The model's config.json (Qwen2VLForConditionalGeneration, bf16) for one of SHAPES."""
    sh = SHAPES[shape]
    text_config = {
        "model_type": "qwen2_vl_text",
        "vocab_size": TEXT_VOCAB_SIZE,
        "hidden_size": sh.hidden,
        "intermediate_size": sh.intermediate,
        "num_hidden_layers": sh.layers,
        "num_attention_heads": sh.heads,
        "num_key_value_heads": sh.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": sh.max_positions,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "max_window_layers": sh.layers,
        "attention_dropout": 0.0,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": list(sh.mrope_section),
        },
        "bos_token_id": TOKEN_ID["<|endoftext|>"],
        "eos_token_id": TOKEN_ID["<|im_end|>"],
        "pad_token_id": TOKEN_ID["<|endoftext|>"],
        "dtype": "bfloat16",
    }
    vision_config = {
        "model_type": "qwen2_vl",
        "depth": sh.vision_depth,
        "embed_dim": sh.vision_embed_dim,
        "hidden_size": sh.hidden,  # = text hidden size (the merger projects into it)
        "hidden_act": "quick_gelu",
        "mlp_ratio": sh.vision_mlp_ratio,
        "num_heads": sh.vision_heads,
        "in_channels": 3,
        "in_chans": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "text_config": text_config,
        "vision_config": vision_config,
        "image_token_id": TOKEN_ID["<|image_pad|>"],
        "video_token_id": TOKEN_ID["<|video_pad|>"],
        "vision_start_token_id": TOKEN_ID["<|vision_start|>"],
        "vision_end_token_id": TOKEN_ID["<|vision_end|>"],
        "vision_token_id": TOKEN_ID["<|vision_pad|>"],
        "bos_token_id": TOKEN_ID["<|endoftext|>"],
        "eos_token_id": TOKEN_ID["<|im_end|>"],
        "pad_token_id": TOKEN_ID["<|endoftext|>"],
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }


def preprocessor_dict(shape: str = "tiny") -> dict:
    sh = SHAPES[shape]
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "rescale_factor": 1 / 255,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "min_pixels": sh.min_pixels,
        "max_pixels": sh.max_pixels,
        "size": {"shortest_edge": sh.min_pixels, "longest_edge": sh.max_pixels},
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }


def _write_tokenizer(out: Path, max_positions: int) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    for t, i in TOKEN_ID.items():
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t} got id {tok.token_to_id(t)}, expected {i}")
    tok.save(str(out / "tokenizer.json"))

    # vocab.json / merges.txt too, for loaders that build the BPE from them.
    model = json.loads(tok.to_str())["model"]
    (out / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")

    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": max_positions,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in TOKEN_ID.items()
        },
        "additional_special_tokens": SPECIAL_TOKENS[1:],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": SPECIAL_TOKENS[1:],
            },
            indent=2,
        )
    )


def _write_random_weights(out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2VLConfig.from_pretrained(str(out))
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    if not (out / "model.safetensors").exists():
        raise RuntimeError(f"save_pretrained wrote no model.safetensors in {out}")


def write_tiny_qwen2_vl(
    out_dir: str | Path, *, random_weights: bool, seed: int = 0, shape: str = "tiny"
) -> Path:
    """Write the Qwen2-VL model of ``shape`` into ``out_dir`` (created if needed) and return its path.

    Raises ValueError for an unknown shape, and for random weights of any shape but ``tiny``
    (the 7B shape is meant for ``load_format="dummy"``).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: expected one of {sorted(SHAPES)}")
    if random_weights and shape != "tiny":
        raise ValueError(
            f"--random-weights is for the tiny shape only; load {shape!r} with load_format='dummy'"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.dumps(config_dict(shape), indent=2)
    if random_weights:
        (out / "config.json").write_text(config)
        _write_random_weights(out, seed)
    # Written after save_pretrained (which rewrites config.json and generation_config.json), so both
    # modes give the same files apart from the weights.
    (out / "config.json").write_text(config)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": TOKEN_ID["<|endoftext|>"],
                "eos_token_id": [TOKEN_ID["<|im_end|>"], TOKEN_ID["<|endoftext|>"]],
                "pad_token_id": TOKEN_ID["<|endoftext|>"],
            },
            indent=2,
        )
    )
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_dict(shape), indent=2))
    _write_tokenizer(out, SHAPES[shape].max_positions)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="write real random bf16 weights (else load with load_format='dummy')",
    )
    parser.add_argument("--seed", type=int, default=0, help="torch seed for --random-weights")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="tiny",
        help="tiny (default), 2b or 7b: Qwen2-VL-2B's or -7B's text and vision shapes, config only",
    )
    args = parser.parse_args(argv)
    if args.random_weights and args.shape != "tiny":
        parser.error(
            "--random-weights is for --shape tiny only (start 2b and 7b with load_format='dummy')"
        )
    out = write_tiny_qwen2_vl(
        args.out_dir, random_weights=args.random_weights, seed=args.seed, shape=args.shape
    )
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
