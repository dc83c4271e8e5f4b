"""The built-in demo model: a small Llama trained for a few hundred steps on the bundled corpus.

Built offline in well under a minute on two CPU cores, then cached. Its predictions are peaked, so
quantization and lower precision visibly move the quality figures. Weights are saved in bfloat16,
like most hub checkpoints, so the transformers default (dtype="auto") differs from the fp32 reference.

Beside it, `demo-draft` is a much smaller Llama with the demo's own tokenizer, trained on the same
corpus: the assistant model for speculative decoding (`assistant_model=`), offline.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune.data import CORPUS
from autotune.paths import DEMO_MAX_POSITIONS, DEMO_VERSION, DRAFT_VERSION, demo_draft_path, demo_model_path

log = logging.getLogger(__name__)

VOCAB_SIZE = 1024
TRAIN_STEPS = 400
SEQUENCE = 64
BATCH = 16
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]


def demo_model_built(cache_dir: Path) -> bool:
    return (demo_model_path(cache_dir) / "config.json").exists()


def ensure_demo_model(cache_dir: Path) -> Path:
    """Build the demo model unless it is cached; concurrent builders race safely to one rename."""
    target = demo_model_path(cache_dir)
    if not demo_model_built(cache_dir):
        _build_once(target, DEMO_VERSION, build_demo_model)
    return target


def ensure_demo_draft(cache_dir: Path) -> Path:
    """Build the demo's draft model (and the demo model, whose tokenizer it shares) unless cached."""
    demo = ensure_demo_model(cache_dir)
    target = demo_draft_path(cache_dir)
    if not (target / "config.json").exists():
        _build_once(target, DRAFT_VERSION, lambda staging: build_demo_draft(staging, demo))
    return target


def _build_once(target: Path, version: str, build: Callable[[Path], None]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{version}."))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build_demo_model(out: Path) -> None:
    tokenizer = _train_tokenizer(CORPUS.read_text())
    _build_llama(out, tokenizer, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4)


def build_demo_draft(out: Path, demo: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo)
    _build_llama(out, tokenizer, hidden_size=64, intermediate_size=192, num_hidden_layers=1, num_attention_heads=2)


def _build_llama(out: Path, tokenizer: Any, **sizes: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = torch.tensor(tokenizer(CORPUS.read_text(), add_special_tokens=False)["input_ids"])
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        num_key_value_heads=2,
        max_position_embeddings=DEMO_MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **sizes,
    )
    model = LlamaForCausalLM(config)
    _train(model, ids)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)


def _train_tokenizer(text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>", padding_side="left"
    )


def _train(model: torch.nn.Module, ids: torch.Tensor) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=TRAIN_STEPS)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for step in range(TRAIN_STEPS):
        starts = torch.randint(0, len(ids) - SEQUENCE - 1, (BATCH,), generator=generator)
        batch = torch.stack([ids[start : start + SEQUENCE] for start in starts])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 100 == 0 or step == TRAIN_STEPS - 1:
            log.info("demo model: step %d loss %.3f", step, loss.item())
    model.eval()
