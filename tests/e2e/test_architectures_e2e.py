"""Models nobody here wrote: a tiny model of each decoder-only family loads and generates through the worker's own
code, and a short real search runs on two of them.

Some families refuse an attention backend when loaded (gemma2, gptj and bloom refuse sdpa; gpt2, falcon, gptj and
bloom refuse flex_attention). The reference and the baseline load without attn_implementation, so transformers picks
what the model supports, and a refused value is `unsupported` once, then excluded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.paths import demo_model_path
from autotune.process.results import ModelSpec, Outcome, WorkloadSpec
from autotune.space import Target, build_plan
from autotune.study import exclusions, open_storage, records
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import BRIEF
from tests.tiny_models import ARCHITECTURES, build_tiny_model

pytestmark = pytest.mark.slow

ATTENTIONS = ("sdpa", "eager", "flex_attention")
WORKLOAD = WorkloadSpec(batch_size=2, input_len=16, output_len=8)
REFUSAL = "does not support an attention implementation"
# A full search on two families: one that refuses sdpa (the baseline's usual attention), one that refuses flex and runs
# the other two. gemma2's flex_attention trial compiled flex's kernels for a minute of CPU on a cold cache, and showed
# nothing gpt2's eager trial does not: gemma2 searches the two others.
SEARCHED = {"gemma2": ("sdpa", "eager"), "gpt2": ATTENTIONS}


@pytest.fixture
def tiny_model(request: pytest.FixtureRequest, tmp_path: Path, cache_dir: Path) -> Path:
    model_type = request.param
    return build_tiny_model(model_type, tmp_path / model_type, ensure_demo_model(cache_dir))


@pytest.mark.parametrize("tiny_model", ARCHITECTURES, indirect=True)
def test_every_architecture_loads_with_each_attention_it_takes_and_generates(tiny_model: Path):
    """What a trial does to the model, in this process: load with each attention (a refusal is `unsupported`
    with transformers' reason), then one generate with the attention transformers picks."""
    from autotune.worker.failures import classify
    from autotune.worker.generation import PaddedGeneration, build_inputs
    from autotune.worker.loading import load_model, load_tokenizer

    spec = ModelSpec(tiny_model.name, path=str(tiny_model))
    target = Target("cpu", requests=WORKLOAD.batch_size)
    refused = set()
    for attention in ATTENTIONS:
        config = {"dtype": "float32", "attn_implementation": attention}
        try:
            load_model(spec, build_plan(config, target), "cpu")
        except Exception as error:  # what a trial would classify
            classified = classify(error, config)
            assert classified.outcome == Outcome.UNSUPPORTED and REFUSAL in classified.message, classified
            assert classified.knob == "attn_implementation"
            refused.add(attention)
    assert refused < set(ATTENTIONS), "the family takes none of the attentions"

    default = build_plan({"dtype": "float32"}, target)
    assert "attn_implementation" not in default.load  # transformers picks, as for the reference and the baseline
    model = load_model(spec, default, "cpu")
    assert model.config._attn_implementation == _default_attention(tiny_model)
    tokenizer = load_tokenizer(spec)
    workload = PaddedGeneration(
        model, default, build_inputs(tokenizer, WORKLOAD, WORKLOAD.batch_size), WORKLOAD, tokenizer.pad_token_id
    )
    generated = workload.run().generated
    assert [len(tokens) for tokens in generated] == [WORKLOAD.output_len] * WORKLOAD.batch_size


@pytest.mark.parametrize("tiny_model", list(SEARCHED), indirect=True)
def test_a_short_search_runs_and_excludes_a_refused_attention(tiny_model: Path, cli_env):
    model_type = tiny_model.name
    workdir = tiny_model.parent
    attentions = SEARCHED[model_type]
    (workdir / "space.yaml").write_text(
        f"knobs:\n  dtype: [float32]\n  attn_implementation: [{', '.join(attentions)}]\n"
    )
    shape = ["--batch-size", "2", "--input-len", "16", "--output-len", "8", *BRIEF]
    command = [sys.executable, "-m", "autotune", "search", "--model", str(tiny_model), "--gpu", "cpu",
               "--space", "space.yaml", "--trials", "3", "--study", model_type, *shape]  # fmt: skip
    completed = subprocess.run(command, cwd=workdir, env=cli_env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout + completed.stderr

    study = optuna.load_study(
        study_name=model_type, storage=open_storage(f"sqlite:///{workdir}/studies/{model_type}.db")
    )
    runs = [record for record in records(study) if record.launched]
    assert len(runs) == len(attentions)  # the space's every value once, within the 3 trials asked
    anchor = runs[0]
    assert anchor.complete and {"reference", "baseline"} <= set(anchor.roles), anchor.message
    assert anchor.config["attn_implementation"] == _default_attention(tiny_model)
    refused = {}
    for record in runs[1:]:
        if record.complete:
            continue
        value = record.config["attn_implementation"]
        assert record.outcome == "unsupported" and REFUSAL in record.message, (record.outcome, record.message)
        assert value not in refused, f"{value} was tried twice"
        refused[value] = record.number
    assert refused, f"{model_type} refuses an attention, yet no trial was refused"
    assert set(refused) == set(exclusions(study).get("attn_implementation", {}))
    assert {record.config["attn_implementation"] for record in runs} == set(attentions)


def _default_attention(model: Path) -> str:
    """What transformers picks for this architecture when loading it without attn_implementation."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    return skeleton.config._attn_implementation


def test_a_workload_longer_than_the_context_is_refused_by_the_prepare_worker_too(tmp_path: Path, cache_dir: Path):
    """A hub model's config is first read in the worker: it refuses there, before the reference runs.

    Without the check, gpt2's learned position embeddings end in an IndexError inside the reference.
    """
    from autotune.errors import UserError
    from autotune.measure.prepare import prepare
    from autotune.paths import PACKAGED_SPACE
    from autotune.profiles import resolve_hardware
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
