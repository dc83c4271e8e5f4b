"""Bad input: one line on stderr that says what to fix, exit status 2, no traceback, nothing stored."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_main


def assert_one_line_error(completed, contains: str) -> None:
    assert completed.returncode == 2, completed.stdout + completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith("autotune: error: ")
    assert contains in lines[0]
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", "--model", "demo"], "give a budget"),  # autotune's own refusal
        (["search", "--model", "demo", "--trials", "1", "--bogus"], "No such option: --bogus"),  # click's
    ],
)
def test_bad_input_in_a_process_of_its_own(tmp_path: Path, cli_env, args, message):
    """The exit-2 path itself, as a shell sees it: start-up and import noise would show on stderr here."""
    completed = run_cli(args, tmp_path, cli_env, timeout=120)
    assert_one_line_error(completed, message)
    assert not (tmp_path / "studies").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", "--model", "demo", "--trials", "1", "--gpu", "v100"], "unknown --gpu 'v100'"),
        (["search", "--model", "demo", "--budget", "5 parsecs"], "--budget '5 parsecs' is not a duration"),
        (["search", "--model", "demo", "--trials", "1", "--device", "tpu"], "--device 'tpu'"),
        (["search", "--model", "./no/such/model", "--trials", "1", "--gpu", "cpu"], "does not exist"),
        (["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--space", "nope.yaml"], "cannot read"),
        (["search", "--model", "demo", "--trials", "0"], "--trials"),
        (["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--bogus"], "No such option: --bogus"),
        (["report", "--study", "nothing-here"], "no study named 'nothing-here'"),
        (["search", "--model", "demo", "--trials", "1", "--constraint", "kl=0.01"], "cannot read constraint 'kl=0.01'"),
        (["search", "--model", "demo", "--trials", "1", "--constraint", "speed>=5"], "unknown metric 'speed'"),
    ],
)
def test_bad_input(tmp_path: Path, cli_env, args, message):
    completed = run_main(args, tmp_path, cli_env)
    assert_one_line_error(completed, message)
    assert not (tmp_path / "studies").exists() or not any((tmp_path / "studies").glob("*.db"))


def test_bad_space_value_names_the_knob(tmp_path: Path, cli_env):
    (tmp_path / "space.yaml").write_text("knobs:\n  dtype: [float32, int3]\n")
    completed = run_main(
        ["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--space", "space.yaml"], tmp_path, cli_env
    )
    assert_one_line_error(completed, "knob 'dtype' does not take 'int3'")


def test_gpus_lists_the_profiles(tmp_path: Path, cli_env):
    completed = run_main(["gpus"], tmp_path, cli_env)
    assert completed.returncode == 0
    for name in ("t4", "a10g", "l4", "a100-40gb", "a100-80gb", "h100", "h200", "cpu"):
        assert f" {name} " in completed.stdout


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("knobs:\n  dtype: [float32\n", "YAML syntax error at line"),
        ("knobs:\n  turbo_mode: [on]\n", "unknown knob 'turbo_mode'"),
    ],
)
def test_bad_space_files(tmp_path: Path, cli_env, space, message):
    (tmp_path / "space.yaml").write_text(space)
    completed = run_main(
        ["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--space", "space.yaml"], tmp_path, cli_env
    )
    assert_one_line_error(completed, message)
    assert not (tmp_path / "studies").exists()


def test_a_hub_id_that_cannot_be_reached_offline(tmp_path: Path, cli_env):
    env = {**cli_env, "HF_HUB_OFFLINE": "1"}
    completed = run_cli(["search", "--model", "no-such-org/no-such-model", "--trials", "1", "--gpu", "cpu"],
                        tmp_path, env, timeout=300)  # fmt: skip
    assert_one_line_error(completed, "cannot load model 'no-such-org/no-such-model'")
    assert not list(tmp_path.glob("studies/*"))


@pytest.mark.parametrize(
    "storage",
    ["postgresql+psycopg://autotune:s3cret-pw@127.0.0.1:no-port/studies", "nosuchdb://autotune:s3cret-pw@host/x"],
)
def test_a_storage_that_cannot_be_opened_never_shows_its_password(tmp_path: Path, cli_env, storage):
    completed = run_main(
        ["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--storage", storage], tmp_path, cli_env
    )
    assert_one_line_error(completed, "cannot open storage")
    assert "s3cret-pw" not in completed.stderr + completed.stdout
    assert "autotune:***@" in completed.stderr


def _plant_study(tmp_path: Path, **changes) -> str:
    """A study as an earlier `autotune search --model demo --gpu cpu` would have left it, with some settings changed."""
    import optuna

    from autotune.paths import PACKAGED_SPACE
    from autotune.profiles import PROFILES
    from autotune.space import load_space
    from autotune.specs import QualitySpec, WorkloadSpec
    from autotune.study import SETTINGS_ATTR, StudySettings

    space = load_space(PACKAGED_SPACE)
    settings = StudySettings("demo", None, PROFILES["cpu"], space.fingerprint(), space.to_json(), WorkloadSpec(),
                             QualitySpec())  # fmt: skip
    for key, value in changes.items():
        setattr(settings, key, replace(getattr(settings, key), **value) if isinstance(value, dict) else value)
    url = f"sqlite:///{tmp_path}/studies/demo-cpu.db"
    (tmp_path / "studies").mkdir()
    study = optuna.create_study(study_name="demo-cpu", storage=url, directions=["maximize", "minimize", "minimize"])
    study.set_user_attr(SETTINGS_ATTR, settings.to_json())
    return url


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "another/model"}, "created with another model"),
        ({"space_fingerprint": "0" * 16}, "search space"),
        # of a workload, only what differs: a shortened dict of every field hid it
        ({"workload": {"min_seconds": 1.0}}, "another workload ({'min_seconds': 1.0}, now {'min_seconds': 3.0})"),
    ],
)
def test_an_existing_study_with_other_settings_is_refused(tmp_path: Path, cli_env, changes, message):
    _plant_study(tmp_path, **changes)
    database = tmp_path / "studies" / "demo-cpu.db"
    before = database.read_bytes()
    completed = run_main(["search", "--model", "demo", "--trials", "1", "--gpu", "cpu"], tmp_path, cli_env)
    assert_one_line_error(completed, message)
    assert "--study NEW_NAME" in completed.stderr
    assert database.read_bytes() == before


def test_a_models_own_code_runs_only_with_trust_remote_code(tmp_path: Path, cli_env):
    model = tmp_path / "custom-model"
    model.mkdir()
    marker = tmp_path / "remote-code-ran"
    (model / "configuration_custom.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('yes')\n"
        "from transformers import LlamaConfig\n\n"
        "class CustomConfig(LlamaConfig):\n    model_type = 'custom-llama'\n"
    )
    (model / "config.json").write_text(
        '{"model_type": "custom-llama", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}'
    )
    args = ["search", "--model", str(model), "--trials", "1", "--gpu", "cpu"]
    completed = run_cli(args, tmp_path, cli_env, timeout=300)
    assert_one_line_error(completed, "runs only with --trust-remote-code")
    assert not marker.exists(), "the model's code ran without --trust-remote-code"
    run_cli([*args, "--trust-remote-code"], tmp_path, cli_env, timeout=300)
    assert marker.exists(), "--trust-remote-code did not reach from_pretrained"
