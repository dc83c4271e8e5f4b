"""The demo model's draft: a much smaller model with the same tokenizer, so assisted generation runs offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.paths import demo_draft_path, demo_model_path
from autotune.worker.demo_model import ensure_demo_draft


@pytest.mark.slow
def test_the_draft_shares_the_demo_tokenizer_and_is_much_smaller(cache_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    draft = ensure_demo_draft(cache_dir)
    demo = demo_model_path(cache_dir)
    assert draft == demo_draft_path(cache_dir)
    assert (draft / "tokenizer.json").read_bytes() == (demo / "tokenizer.json").read_bytes()
    draft_config, demo_config = AutoConfig.from_pretrained(draft), AutoConfig.from_pretrained(demo)
    assert draft_config.vocab_size == demo_config.vocab_size
    assert (draft_config.bos_token_id, draft_config.eos_token_id, draft_config.pad_token_id) == (
        demo_config.bos_token_id,
        demo_config.eos_token_id,
        demo_config.pad_token_id,
    )
    sizes = [AutoModelForCausalLM.from_pretrained(path).num_parameters() for path in (draft, demo)]
    assert sizes[0] * 3 < sizes[1]


@pytest.mark.slow
def test_the_draft_is_cached_not_rebuilt(cache_dir: Path) -> None:
    weights = ensure_demo_draft(cache_dir) / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert ensure_demo_draft(cache_dir) / "model.safetensors" == weights
    assert weights.stat().st_mtime_ns == built_at


@pytest.mark.slow
def test_assisted_generation_with_the_draft_keeps_the_greedy_output(cache_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autotune.data import load_prompts

    draft_path = ensure_demo_draft(cache_dir)
    demo_path = demo_model_path(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(demo_path)
    model = AutoModelForCausalLM.from_pretrained(demo_path, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.float32).eval()
    for prompt in load_prompts()[:2]:
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        settings = {"max_new_tokens": 24, "min_new_tokens": 24, "do_sample": False, "pad_token_id": 0}
        with torch.inference_mode():
            plain = model.generate(**inputs, **settings)
            assisted = model.generate(**inputs, **settings, assistant_model=draft, num_assistant_tokens=4)
        assert assisted.tolist() == plain.tolist()
