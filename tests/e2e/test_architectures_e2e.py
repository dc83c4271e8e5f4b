"""Models nobody here wrote: a short real search on a tiny model of each decoder-only family.

Some families refuse an attention backend when loaded (gemma2, gptj and bloom refuse sdpa; gpt2, falcon,
gptj and bloom refuse flex_attention). The reference and the baseline load without attn_implementation,
so transformers picks what the model supports, and a refused value is `unsupported` once, then excluded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.paths import demo_model_path
from autotune.study import exclusions, open_storage, records
from autotune.worker.demo_model import ensure_demo_model
from tests.tiny_models import ARCHITECTURES, build_tiny_model

pytestmark = pytest.mark.slow

SPACE = "knobs:\n  dtype: [float32]\n  attn_implementation: [sdpa, eager, flex_attention]\n"
WORKLOAD = ["--batch-size", "2", "--input-len", "16", "--output-len", "8"]
REFUSAL = "does not support an attention implementation"


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_a_short_search_runs_on_every_architecture(tmp_path: Path, cache_dir: Path, cli_env, model_type: str):
    ensure_demo_model(cache_dir)
    model = build_tiny_model(model_type, tmp_path / model_type, demo_model_path(cache_dir))
    (tmp_path / "space.yaml").write_text(SPACE)
    command = [sys.executable, "-m", "autotune", "search", "--model", str(model), "--gpu", "cpu",
               "--space", "space.yaml", "--trials", "3", "--study", model_type, *WORKLOAD]  # fmt: skip
    completed = subprocess.run(command, cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout + completed.stderr

    study = optuna.load_study(
        study_name=model_type, storage=open_storage(f"sqlite:///{tmp_path}/studies/{model_type}.db")
    )
    runs = [record for record in records(study) if record.launched]
    assert len(runs) == 3
    anchor = runs[0]
    assert anchor.complete and {"reference", "baseline"} <= set(anchor.roles), anchor.message
    default = _default_attention(model)
    assert anchor.config["attn_implementation"] == default
    refused = {}
    for record in runs[1:]:
        value = record.config["attn_implementation"]
        if record.complete:
            continue
        assert record.outcome == "unsupported" and REFUSAL in record.message, (record.outcome, record.message)
        assert value not in refused, f"{value} was tried twice"
        refused[value] = record.number
    assert set(refused) == set(exclusions(study).get("attn_implementation", {}))
    tried = {record.config["attn_implementation"] for record in runs}
    assert tried == {"sdpa", "eager", "flex_attention"}


def _default_attention(model: Path) -> str:
    """What transformers picks for this architecture when loading it without attn_implementation."""
    probe = (
        "import sys, torch\nfrom transformers import AutoConfig, AutoModelForCausalLM\n"
        "with torch.device('meta'):\n"
        "    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))\n"
        "print(model.config._attn_implementation)"
    )
    completed = subprocess.run([sys.executable, "-c", probe, str(model)], capture_output=True, text=True, check=True)
    return completed.stdout.strip().splitlines()[-1]


def test_a_workload_longer_than_the_context_is_refused_by_the_prepare_worker_too(tmp_path: Path, cache_dir: Path):
    """A hub model's config is first read in the worker: it refuses there, before the reference runs.

    Without the check, gpt2's learned position embeddings end in an IndexError inside the reference.
    """
    from autotune.errors import UserError
    from autotune.paths import PACKAGED_SPACE
    from autotune.profiles import resolve_hardware
    from autotune.search.prepare import prepare
    from autotune.space import load_space
    from autotune.specs import ModelSpec, SearchRequest, StorageSpec, WorkloadSpec

    ensure_demo_model(cache_dir)
    model = build_tiny_model("gpt2", tmp_path / "gpt2", demo_model_path(cache_dir))  # n_positions 256
    workload = WorkloadSpec(batch_size=2, input_len=250, output_len=16)
    request = SearchRequest(ModelSpec(str(model)), workload=workload, storage=StorageSpec(cache_dir=cache_dir))
    hardware = resolve_hardware("cpu", None)
    with pytest.raises(UserError) as refused:
        prepare(request, hardware, load_space(PACKAGED_SPACE), tmp_path / "work", deadline=None)
    assert str(refused.value) == (
        "--input-len 250 + --output-len 16 = 266 tokens, but the model has 256 positions (n_positions in its "
        "config); lower --input-len or --output-len to fit 256"
    )
