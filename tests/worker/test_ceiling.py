"""The decode ceiling's hand loop (autotune/worker/ceiling.py) decodes what generate() decodes."""

from __future__ import annotations

import torch

from autotune.worker.ceiling import HandLoop, timed_decode


def test_the_hand_loop_decodes_the_greedy_tokens_of_generate_with_a_static_cache(cache_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autotune.specs import WorkloadSpec
    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import build_inputs

    path = ensure_demo_model(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    spec = WorkloadSpec(batch_size=2, input_len=32, output_len=12)
    rows = build_inputs(AutoTokenizer.from_pretrained(path), spec, spec.batch_size)
    input_ids = torch.tensor(rows)
    expected = model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=12, min_new_tokens=12,
        do_sample=False, pad_token_id=0, cache_implementation="static", disable_compile=True,
    )[:, 32:]  # fmt: skip
    loop = HandLoop(model, input_ids, 12, mode="off")
    for _ in range(2):  # the second call starts from a reset cache
        tok_s, tokens = timed_decode(loop)
        assert tokens.tolist() == expected.tolist() and tok_s > 0
