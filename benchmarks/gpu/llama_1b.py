"""Build a Llama of 1.1B parameters (TinyLlama's shape), or of Llama-3-8B's shape, offline, with the demo tokenizer.

Random weights give near-uniform next-token distributions, so quality figures barely move and greedy
outputs may repeat one token. The build therefore trains the model briefly on the bundled corpus
(bf16 autocast, AdamW, batches of 16 x 128 tokens) to make its predictions peaked, then saves it in
bfloat16 with the tokenizer, under the autotune cache (models/llama-1b-s<steps>); a folder that is
already there is reused.

    python benchmarks/gpu/llama_1b.py --device cuda                # prints the model folder on its last line
    python benchmarks/gpu/llama_1b.py --device cpu --small --train-steps 2 --out /tmp/tiny-llama   # a test
    python benchmarks/gpu/llama_1b.py --device cuda --shape 8b --train-steps 0   # Llama-3-8B's shape, random weights

The 8B shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocabulary 32000) is built in
bfloat16 on the device and not trained: its speed and memory are an 8B model's, its quality figures mean little.

torch is imported inside the functions that need it: benchmarks/gpu/gpu_proof.py imports this module for
`model_folder` only, and its own process never imports torch.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, when run as a script from anywhere

from autotune.paths import default_cache_dir

# TinyLlama-1.1B's shape; --small keeps the architecture at a size a CPU builds in seconds.
SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
}
SHAPE_8B = {  # Llama-3-8B's, with the demo tokenizer's vocabulary size below
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
SMALL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
VOCAB_SIZE = 32000  # more than the demo tokenizer's 1024 ids: the ones past them are never produced
MAX_POSITIONS = 2048
DEFAULT_TRAIN_STEPS = 60
LEARNING_RATE = 3e-4
BATCH, SEQUENCE = 16, 128


SHAPES = {"1b": SHAPE, "8b": SHAPE_8B, "small": SMALL_SHAPE}


def model_folder(cache_dir: Path, train_steps: int, small: bool = False, shape: str = "1b") -> Path:
    """Where the built model is kept: one folder per shape and number of training steps."""
    name = "llama-1b-small" if small or shape == "small" else f"llama-{shape}"
    return cache_dir / "models" / f"{name}-s{train_steps}"


def ensure_llama(out: Path, train_steps: int, device: str, small: bool = False, shape: str = "1b") -> Path:
    """Build the model into `out` unless a saved one is there; built in a staging folder, then renamed."""
    if (out / "config.json").exists():
        print(f"reusing {out}", flush=True)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        build(staging, train_steps, device, "small" if small else shape)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def build(out: Path, train_steps: int, device: str, shape: str = "1b") -> None:
    """Build, train briefly and save (bfloat16, with the tokenizer) a Llama into `out`; untrained ones are built in
    bfloat16 directly (an 8B model in float32 would need 32 GB before its conversion)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from autotune.worker.demo_model import ensure_demo_model

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(ensure_demo_model(default_cache_dir()))
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    if not train_steps:
        torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"parameters: {parameters / 1e9:.3f} B, built in {time.monotonic() - started:.1f}s", flush=True)
    if train_steps:
        train(model, tokenizer, train_steps, device)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"saved in {time.monotonic() - started:.1f}s in all", flush=True)


def train(model: Any, tokenizer: Any, steps: int, device: str) -> None:
    """Fit the model briefly on the bundled corpus, so that its outputs are not degenerate."""
    import torch

    from autotune.data import CORPUS

    ids = torch.tensor(tokenizer(CORPUS.read_text(), add_special_tokens=False)["input_ids"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(ids) - SEQUENCE - 1, (BATCH,), generator=generator)
        batch = torch.stack([ids[start : start + SEQUENCE] for start in starts]).to(device)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="where to build and train: cuda, cuda:N or cpu")
    parser.add_argument("--train-steps", type=int, default=DEFAULT_TRAIN_STEPS)
    parser.add_argument("--small", action="store_true", help="hidden 64, 2 layers: to test the build on a CPU")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="1b (TinyLlama's), 8b (Llama-3-8B's)")
    parser.add_argument("--out", type=Path, help="model folder [default: <autotune cache>/models/llama-1b-s<steps>]")
    args = parser.parse_args()
    out = args.out or model_folder(default_cache_dir(), args.train_steps, args.small, args.shape)
    print(ensure_llama(out, args.train_steps, args.device, args.small, args.shape), flush=True)


if __name__ == "__main__":
    main()
