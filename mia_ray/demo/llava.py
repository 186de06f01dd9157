"""A tiny, randomly initialised LLaVA built from a config (no download), and image-text samples.

It exercises LUMIA's multimodal path (vision encoder + language model hooks, the processor,
image loading) exactly as a real LLaVA checkpoint does, in seconds on a CPU. Its weights are
random: it carries no membership signal, so probes on it must stay near chance.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

IMAGE_TOKEN = "<image>"


def build_tiny_llava(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 0) -> Path:
    """Save a LLaVA (CLIP vision tower, 2 blocks; Llama language model, 2 blocks) with its
    processor to ``out_dir``. ``tokenizer_dir``: any saved HF tokenizer (the demo world's)."""
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    out = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    size = 32
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLIP's class token
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=size,
            patch_size=8,
        ).to_dict(),
        text_config=LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=tok.pad_token_id,
        ).to_dict(),
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def make_image_text_samples(
    out_dir: str | Path, texts: list[str], labels: list[int], seed: int = 0, size: int = 40
) -> Path:
    """Write one PNG per text (seeded random colour blocks) and ``samples.jsonl`` with
    ``{id, text, image, label}`` (image paths relative to the jsonl). Returns the jsonl path."""
    import numpy as np
    from PIL import Image

    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    order = random.Random(seed)
    lines = []
    for i, (text, label) in enumerate(zip(texts, labels, strict=True)):
        blocks = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        img = Image.fromarray(blocks).resize((size, size), Image.NEAREST)
        rel = f"images/{i:05d}.png"
        img.save(out / rel)
        lines.append({"id": f"s{i:05d}", "text": text, "image": rel, "label": int(label)})
    order.shuffle(lines)
    path = out / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return path
