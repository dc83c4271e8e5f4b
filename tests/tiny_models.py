"""Tiny randomly initialised causal LMs of many architectures, built offline from their configs.

Each shares the demo model's tokenizer (1024 tokens), so any of them can be searched like a hub model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# Decoder-only families transformers ships configs for; the size names each config maps to its own.
ARCHITECTURES = ("llama", "mistral", "qwen3", "phi3", "gemma2", "gpt2", "gpt_neox", "opt", "falcon", "gptj", "bloom")
SIZE = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
OWN_NAMES = {  # where a config calls a size otherwise, or needs one more
    "gpt2": {"n_positions": 256, "n_inner": 128},
    "gptj": {"n_positions": 256, "rotary_dim": 8, "n_inner": 128},
    "opt": {"ffn_dim": 128, "word_embed_proj_dim": 64},
    "gemma2": {"head_dim": 16},
    "falcon": {"new_decoder_architecture": False, "multi_query": True},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tiny_model(model_type: str, out: Path, demo_model: Path) -> Path:
    """Save a random tiny `model_type` model with the demo's tokenizer to `out` (kept when already there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = AutoConfig.for_model(model_type, **SIZE, **OWN_NAMES.get(model_type, {}), **special)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (demo_model / name).exists():
            shutil.copy(demo_model / name, out / name)
    return out
