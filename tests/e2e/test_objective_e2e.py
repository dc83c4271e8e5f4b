"""One real `autotune search --objective latency` on the demo model, on this CPU: the stored study optimises
the latency objectives under the latency workload, its report plots them, and a resume with another
preset is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest

from autotune.study import load_stored_study, stored_settings
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import BRIEF, run_cli

pytestmark = pytest.mark.slow

# The small workload: what is under test is which objectives are stored and plotted, not the workload's shape.
SEARCH = ["search", "--model", "demo", "--gpu", "cpu", "--trials", "3", "--study", "latency-demo",
          "--input-len", "32", "--output-len", "16", *BRIEF]  # fmt: skip


def _figure_layout(html: str, div_id: str) -> dict:
    """The layout plotly was given for one figure of the page (its JSON follows the div's id)."""
    script = html[html.index(f'"{div_id}"') :]
    return json.loads(re.search(r"\}\],\s*(\{.*?\})\s*,\s*\{\"displaylogo\"", script, re.S).group(1))


def test_a_latency_search_stores_and_plots_the_latency_objectives(tmp_path: Path, cli_env):
    completed = run_cli([*SEARCH, "--objective", "latency"], tmp_path, cli_env, timeout=1800)
    assert completed.returncode == 0, completed.stderr
    assert "note: constraints: kl_divergence<=0.01" in completed.stdout
    assert "per-token latency (p50)" in completed.stdout  # the front table shows the first objective

    study = load_stored_study(f"sqlite:///{tmp_path}/studies/latency-demo.db", "latency-demo")
    settings = stored_settings(study)
    assert settings.objectives == ["tpot_s", "ttft_s"] and settings.workload.kind == "latency"
    assert settings.workload.batch_size == 1  # what ran, not the default batch of 8 it was given
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE] * 2
    assert study.metric_names == ["per-token latency (p50) [s]", "time to first token (p50) [s]"]
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert complete and all(t.values == [t.user_attrs["metrics"]["tpot_s"], t.user_attrs["metrics"]["ttft_s"]]
                            for t in complete)  # fmt: skip

    html = (tmp_path / "reports" / "latency-demo.html").read_text()
    assert "workload: latency, 1 prompt at a time, 32 tokens in, 16 out." in html
    layout = _figure_layout(html, "fig-front")
    assert layout["yaxis"]["title"]["text"] == "per-token latency (p50) (s)"
    assert layout["xaxis"]["title"]["text"] == "time to first token (p50) (s)"
    assert 'id="fig-front-3d"' not in html  # two objectives: no 3-D view

    again = run_cli([*SEARCH, "--objective", "throughput"], tmp_path, cli_env, timeout=120)
    assert_one_line_error(again, "study 'latency-demo' optimises tpot_s, ttft_s, not throughput_tok_s, peak_memory_gb")
