"""A decoding loop of autotune's (decode_loop) as a folder a deployment keeps beside its code: transformers'
`custom_generate` layout, `custom_generate/generate.py`, which generate(custom_generate=FOLDER, trust_remote_code=True)
runs. The loops' modules are copied as they are (they import torch, transformers and each other only): what was
measured is what runs.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from autotune.errors import UserError
from autotune.space.knobs.decoding import loop_names

# autotune/worker/decode_loops.py and the modules it imports relatively, read as text: the study side never imports them
LOOP_MODULES = ("decode_loops.py", "decode_steps.py", "fused_step.py")

ENTRY = '''"""decode_loop={loop}: autotune's decoding loop, run by transformers' generate(custom_generate=<this folder>,
trust_remote_code=True) in place of its own loop, after its own preparation. Written by `autotune loop {loop}`."""

from transformers import GenerationMixin

from .decode_loops import LOOPS


def generate(model, *args, streamer=None, assistant_model=None, synced_gpus=None, **kwargs):
    # generate() hands a custom_generate callable none of these: refused here rather than dropped without a word
    if streamer is not None or assistant_model is not None or synced_gpus:
        raise ValueError("decode_loop={loop} does not stream, assist or sync GPUs: call generate() without it")
    return GenerationMixin.generate(model, *args, custom_generate=LOOPS["{loop}"], **kwargs)
'''


def write_loop_folder(loop: str, folder: Path) -> Path:
    """Write the folder of `loop` (its custom_generate/ holds the entry and the loops' modules); returns the entry."""
    if loop not in loop_names():
        raise UserError(f"no decoding loop {loop!r}: give one of {', '.join(loop_names())}")
    code = folder / "custom_generate"
    try:
        code.mkdir(parents=True, exist_ok=True)
        for module in LOOP_MODULES:
            (code / module).write_text(resources.files("autotune").joinpath("worker", module).read_text())
        entry = code / "generate.py"
        entry.write_text(ENTRY.format(loop=loop))
    except OSError as error:
        raise UserError(f"cannot write the folder {folder}: {error.strerror or error}; give another --out") from error
    return entry
