"""The report of the real demo search (tests/conftest.py: demo_search), as people and scripts use it.

- opened in headless Chromium: no console errors, every plotly figure drawn, nothing fetched;
- an error text with <script> planted in a copy of the study shows as text, and runs nothing;
- each Pareto card's Python snippet, pasted into a fresh Python process, loads the demo model with
  the card's knobs and generates;
- `autotune best` picks from the same study, and exits 3 when nothing fits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.figures.constraints import parse_constraint
from autotune.report.data import collect
from tests.browser import open_page
from tests.conftest import DEMO_CONSTRAINT, DEMO_STUDY, DemoSearch, run_cli

pytestmark = pytest.mark.slow

SCRIPT = "<script>alert(1)</script>"
FIGURES = ("fig-front", "fig-front-3d", "fig-importance", "fig-parallel", "fig-progress")


def test_report_loads_in_chromium_without_errors_and_plotly_draws_every_figure(
    demo_search: DemoSearch, chromium, tmp_path
):
    # A full-page screenshot to look at: AUTOTUNE_TEST_SCREENSHOT=path keeps it after the run.
    screenshot = Path(os.environ.get("AUTOTUNE_TEST_SCREENSHOT") or tmp_path / "report.png")
    page = open_page(
        chromium,
        demo_search.report,
        screenshot=screenshot,
        evaluate={
            "figures": "[...document.querySelectorAll('.plotly-graph-div')].map(d => d.id)",
            "cards": "document.querySelectorAll('article.card').length",
            "webgl": "document.querySelectorAll('#fig-front-3d canvas, #fig-parallel canvas').length",
            "sections": "[...document.querySelectorAll('section h2')].map(h => h.innerText)",
        },
    )
    assert page.errors == [], page.errors
    assert page.requests == [], "the report fetched something"
    assert page.plots == page.plot_divs == len(FIGURES), (page.plots, page.plot_divs)
    assert sorted(page.texts["figures"]) == sorted(FIGURES)
    assert page.texts["webgl"] >= 2, "the 3-D view and the parallel coordinates drew no WebGL canvas"
    front = collect(demo_search.study(), demo_search.storage).pareto
    assert page.texts["cards"] == len(front) > 0
    assert page.texts["sections"] == [
        "Pareto front",
        "Configurations to deploy",
        "What matters",
        "Progress of the search",
        "Failures",
        "All trials",
        "Environment and budget",
    ]
    assert screenshot.stat().st_size > 50_000


def test_an_error_text_with_script_shows_as_text_in_the_browser(demo_search: DemoSearch, chromium, tmp_path):
    """Plant a failed trial whose message holds a script into a copy of the real study, then render."""
    database = tmp_path / "planted.db"
    shutil.copy(demo_search.workdir / "studies" / f"{DEMO_STUDY}.db", database)
    storage = f"sqlite:///{database}"
    study = optuna.load_study(study_name=DEMO_STUDY, storage=storage)
    measured = study.trials[0]  # the planted trial reuses its knobs, so the distributions fit the study's
    config = measured.user_attrs["config"]
    study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            params=measured.params,
            distributions=measured.distributions,
            user_attrs={
                "config": config,
                "roles": ["sampler"],
                "outcome": "error",
                "phase": "load",
                "message": f"RuntimeError: {SCRIPT}<img src=x onerror=alert(2)>",
                "log_tail": f"Traceback (most recent call last):\n{SCRIPT}",
                "duration_s": 1.0,
            },
        )
    )
    out = tmp_path / "planted.html"
    completed = run_cli(
        ["report", "--study", DEMO_STUDY, "--storage", storage, "--out", str(out)],  # --out: --report's old name
        tmp_path,
        demo_search.env,
    )
    assert completed.returncode == 0, completed.stderr
    page = open_page(
        chromium,
        out,
        evaluate={
            "injected_scripts": "[...document.scripts].filter(s => s.textContent.includes('alert(')).length",
            "images": "document.images.length",
            "error_texts": "[...document.querySelectorAll('pre.error')].map(e => e.innerText)",
        },
    )
    assert page.texts["injected_scripts"] == 0 and page.texts["images"] == 0
    assert page.dialogs == [], "a script from the error text ran"
    assert f"RuntimeError: {SCRIPT}<img src=x onerror=alert(2)>" in page.texts["error_texts"]
    assert page.errors == []


# Appended to a pasted snippet: what the process loaded, as JSON on one line.
CHECK = """
import json as _json
_quantization = getattr(model.config, "quantization_config", None)
_quantization = _quantization.to_dict() if hasattr(_quantization, "to_dict") else _quantization
print("LOADED", _json.dumps({
    "dtype": str(model.dtype),
    "attn_implementation": model.config._attn_implementation,
    "load_in_4bit": bool((_quantization or {}).get("load_in_4bit")),
    "load_in_8bit": bool((_quantization or {}).get("load_in_8bit")),
    "device": str(model.device),
}))
"""


def test_each_pareto_cards_python_snippet_runs_in_a_fresh_process(demo_search: DemoSearch, tmp_path):
    data = collect(demo_search.study(), demo_search.storage)
    assert data.cards
    for card in data.cards:
        config = card.record.config
        if config.get("decode_loop", "generate") != "generate":  # its folder, where the snippet's comment says
            assert run_cli(["loop", config["decode_loop"]], tmp_path, demo_search.env).returncode == 0
        completed = subprocess.run(
            [sys.executable, "-c", card.python + CHECK],
            cwd=tmp_path,
            env=demo_search.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert completed.returncode == 0, f"trial #{card.record.number}:\n{card.python}\n{completed.stderr[-3000:]}"
        lines = completed.stdout.strip().splitlines()
        loaded = json.loads(lines[-1].removeprefix("LOADED "))
        generated = "\n".join(lines[:-1])
        assert len(generated.strip("[]'\" \n")) >= 5, f"trial #{card.record.number} generated nothing: {generated!r}"
        assert loaded["attn_implementation"] == config["attn_implementation"]
        assert loaded["load_in_4bit"] == (config["quantization"] == "bnb-4bit")
        assert loaded["load_in_8bit"] == (config["quantization"] == "bnb-8bit")
        if config["quantization"] == "none":
            assert loaded["dtype"] == f"torch.{config['dtype']}"
        assert loaded["device"] == "cpu"


def test_best_picks_from_the_real_study(demo_search: DemoSearch, tmp_path):
    args = ["best", "--study", DEMO_STUDY, "--storage", demo_search.storage]
    completed = run_cli([*args, "--format", "json"], tmp_path, demo_search.env, timeout=120)
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert document["on_front"] is True
    assert document["constraints"] == [str(parse_constraint(DEMO_CONSTRAINT))]  # the study's own applies
    fastest = max(
        (r for r in collect(demo_search.study(), demo_search.storage).complete if r.feasible),
        key=lambda r: r.metrics["throughput_tok_s"],
    )
    assert document["trial"] == fastest.number
    python = run_cli([*args, "--format", "python"], tmp_path, demo_search.env, timeout=120)
    assert python.stdout == document["python"]
    nothing = run_cli([*args, "--max-memory", "1kB"], tmp_path, demo_search.env, timeout=120)
    assert nothing.returncode == 3, nothing.stdout + nothing.stderr
