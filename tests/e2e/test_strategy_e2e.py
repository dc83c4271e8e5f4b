"""The strategy inside a real search: a two-knob space measured to the end on the demo model."""

from __future__ import annotations

import optuna
import pytest

from autotune.study import records
from tests.conftest import BRIEF, run_cli

pytestmark = pytest.mark.slow

SPACE = "knobs:\n  dtype: [float32, bfloat16, float16]\n  attn_implementation: [sdpa, eager]\n"
ORDER = ("reference", "baseline", "warm-up", "composed", "predicted to extend the front", "sampler")


def test_a_search_runs_its_plan_in_order_and_measures_each_configuration_once(tmp_path, cli_env):
    (tmp_path / "space.yaml").write_text(SPACE)
    args = ["search", "--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--study", "two-knobs",
            "--trials", "6", "--batch-size", "2", "--input-len", "32", "--output-len", "16", *BRIEF]  # fmt: skip
    completed = run_cli(args, tmp_path, cli_env)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    study = optuna.load_study(study_name="two-knobs", storage=f"sqlite:///{tmp_path}/studies/two-knobs.db")
    runs = [record for record in records(study) if record.launched]
    assert len(runs) == 6 and all(record.outcome == "ok" for record in runs)
    assert len({tuple(sorted(record.config.items())) for record in runs}) == 6, "the whole space, each once"
    kinds = [next(kind for kind in ORDER if record.roles[0].startswith(kind)) for record in runs]
    assert kinds[:4] == ["reference", "baseline", "warm-up", "warm-up"]  # float32 is the reference already
    # then whatever the figures call for: a composition, a predicted change, or the sampler when
    # nothing planned is left (a sampled trial can join the front and open new predictions)
    assert set(kinds[4:]) <= {"composed", "predicted to extend the front", "sampler"}, kinds
