from pathlib import Path

import optuna
import pytest

from autotune.errors import SpaceError
from autotune.paths import PACKAGED_SPACE
from autotune.space import KNOBS, config_key, load_space, parse_space
from autotune.space.knobs import WorkloadKnob

DEFAULT = load_space(PACKAGED_SPACE)


def test_default_space_declares_every_knob_but_the_workload():
    """The workload is chosen with --workload; a space may still search it as a knob."""
    names = [knob.name for knob in DEFAULT.knobs]
    assert len(names) == len(set(names))
    assert set(names) == set(KNOBS) - {WorkloadKnob.name}


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            {
                "quantization": "bnb-4bit",
                "batching": "generate",
                "cache_implementation": "static",
                "compile": "default",
            },
            "bitsandbytes models are never compiled",
        ),
        ({"attn_implementation": "flash_attention_2", "dtype": "float32"}, "flash attention needs float16 or bfloat16"),
        ({"attn_implementation": "flex_attention", "batching": "continuous"}, "flex_attention is refused"),
    ],
)
def test_rules_forbid_combinations(config, reason):
    full = {
        "dtype": "bfloat16",
        "attn_implementation": "sdpa",
        "quantization": "none",
        "batching": "generate",
        "cache_implementation": "dynamic",
    }
    full.update(config)
    assert reason in DEFAULT.violation(DEFAULT.normalize(full))


def test_no_valid_configuration_breaks_a_rule_or_repeats_and_each_has_only_the_knobs_that_apply():
    """One pass over the default space's configurations (tens of seconds here): every property of each."""
    keys, count = set(), 0
    for config in DEFAULT.configurations():
        assert DEFAULT.violation(config) is None
        assert ("compile" in config) == (config.get("cache_implementation") in ("static", "offloaded_static"))
        assert ("max_batch_tokens" in config) == (config["batching"] == "continuous")
        assert ("cache_implementation" in config) == (config["batching"] == "generate")
        keys.add(config_key(config))
        count += 1
    assert count, "the default space allows nothing"
    assert len(keys) == count, "a configuration repeats"


def test_suggest_samples_only_knobs_that_apply():
    study = optuna.create_study(directions=["maximize"], sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(40):
        trial = study.ask()
        config = DEFAULT.suggest(trial)
        assert config == DEFAULT.normalize(config)
        assert set(trial.params) == set(config)
        study.tell(trial, 0.0)


def test_forbidding_adds_rules_without_changing_the_distributions():
    forbidden = DEFAULT.forbidding({"attn_implementation": {"eager": "eager is broken here"}})
    assert forbidden.knobs == DEFAULT.knobs
    config = {"dtype": "float32", "attn_implementation": "eager", "quantization": "none", "batching": "continuous"}
    assert forbidden.violation(forbidden.normalize({**config, "max_batch_tokens": 256})) == "eager is broken here"


def test_space_round_trips_through_json():
    from autotune.space import SearchSpace

    assert SearchSpace.from_json(DEFAULT.to_json()) == DEFAULT


def test_bare_off_in_yaml_is_read_as_the_string_off(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("knobs:\n  batching: [generate]\n  cache_implementation: [static]\n  compile: [off, default]\n")
    assert load_space(path).knob("compile").values == ("off", "default")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("knobs: [dtype", "YAML syntax error at line"),
        ("knobs:\n  dtype: [float32]\n  turbo: [yes]\n", "unknown knob 'turbo'"),
        ("knobs:\n  dtype: [float64]\n", "does not take 'float64'"),
        ("knobs:\n  max_batch_tokens: [-3]\n", "does not take -3"),
        ("knobs:\n  compile:\n    values: ['off']\n    when: {cache_implementation: static}\n", "declared before it"),
        ("knobs:\n  dtype: [float32]\nrules:\n  - forbid: {dtype: float32}\n", "needs 'forbid:'"),
        ("knobs:\n  dtype: [float32]\nrules:\n  - forbid: {batching: continuous}\n    reason: x\n", "does not declare"),
        ("knobs: {}\n", "needs a 'knobs:' mapping"),
        ("knobs:\n  dtype: [float32]\nextras: 1\n", "unknown section"),
        ("knobs:\n  dtype: [float32]\n  dtype: [bfloat16]\n", "line 3, column 3: 'dtype' is written twice"),
    ],
)
def test_bad_space_files_say_what_to_fix(tmp_path, text, message):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=message):
        load_space(path)


def test_missing_space_file():
    with pytest.raises(SpaceError, match="cannot read search space"):
        load_space(Path("/nonexistent/space.yaml"))


def test_fingerprint_changes_with_values_not_with_order_of_loading():
    a = parse_space({"knobs": {"dtype": ["float32", "bfloat16"]}}, "a")
    b = parse_space({"knobs": {"dtype": ["float32", "bfloat16"]}}, "b")
    c = parse_space({"knobs": {"dtype": ["float32"]}}, "c")
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
