"""`autotune ceiling`: the hand loop measured in a worker process, its figures stored with a study of the same model
and device; a study that is not there, or of another device, refused before anything is measured."""

from __future__ import annotations

import json
from dataclasses import replace

from autotune import study as studies
from autotune.study.ceilings import ceilings
from tests import fakes
from tests.conftest import run_cli, run_main

# A shape the demo model decodes in well under a second per call, uncompiled: the worker's start is most of the time.
QUICK = ["--compile", "off", "--input-len", "16", "--output-len", "4", "--warmup", "1", "--min-iterations", "1",
         "--min-seconds", "0"]  # fmt: skip


def demo_study(path, device_name: str) -> tuple[str, str]:
    """fakes.known_study, of the demo model, searched on the device named."""
    study, url = fakes.known_study(path)
    settings = studies.stored_settings(study)
    prepared = replace(settings.prepared, environment={**settings.prepared.environment, "device_name": device_name})
    studies.update_settings(study, replace(settings, model="demo", prepared=prepared))
    return study.study_name, url


def test_a_study_that_is_not_there_is_refused_before_anything_is_measured(tmp_path, cli_env):
    missing = tmp_path / "none.db"
    completed = run_main(["ceiling", "--model", "demo", "--study", "none", "--storage", f"sqlite:///{missing}"],
                         tmp_path, cli_env)  # fmt: skip
    assert completed.returncode == 2 and not missing.exists()
    assert completed.stderr.strip() == (
        f"autotune: error: no study named 'none' in sqlite:///{missing}; check --study and --storage"
    )


def test_the_hand_loop_runs_in_a_worker_and_its_figures_are_stored_with_the_study(tmp_path, cli_env):
    from autotune.worker.environment import environment

    name, url = demo_study(tmp_path / "demo.db", environment("cpu")["device_name"])
    command = ["ceiling", "--model", "demo", "--batch-size", "1", "--batch-size", "2", *QUICK, "--json",
               "--study", name, "--storage", url]  # fmt: skip
    completed = run_cli(command, tmp_path, cli_env, timeout=300)
    assert completed.returncode == 0, completed.stderr
    printed = json.loads(completed.stdout)
    assert [(f["batch_size"], f["model"], f["device"], f["compile"]) for f in printed] == [
        (1, "demo", "cpu", "off"),
        (2, "demo", "cpu", "off"),
    ]
    assert all(f["decode_tok_s"] > 0 and f["iterations"] >= 1 for f in printed)
    stored = ceilings(studies.load_stored_study(url, name))
    assert [{k: v for k, v in f.items() if k != "stored_at"} for f in stored] == printed


def test_a_study_of_another_device_is_refused_and_nothing_is_stored(tmp_path, cli_env):
    name, url = demo_study(tmp_path / "demo.db", "NVIDIA A10G")
    completed = run_cli(["ceiling", "--model", "demo", *QUICK, "--study", name, "--storage", url], tmp_path, cli_env)
    assert completed.returncode == 2, completed.stderr
    assert f"autotune: error: study '{name}' ran on NVIDIA A10G, not " in completed.stderr
    assert completed.stderr.strip().endswith("measure the hand loop on the study's device")
    assert ceilings(studies.load_stored_study(url, name)) == []
