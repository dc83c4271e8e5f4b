"""A search on the demo trace, end to end: every trial replays the trace's first 24 requests (each its own length),
goodput leads the objectives, the study keeps the trace once and is bound to it, a worker elsewhere fetches it from
the study's artifacts, compare refuses another night's other traffic unless asked, and the report shows the trace."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import optuna
import pytest

from autotune.data import DEMO_TRACE
from autotune.figures.metrics import GOODPUT_TOKENS, PEAK_MEMORY, REQUESTS_SERVED, TOKENS_GENERATED, WASTED_SHARE
from autotune.study import records, stored_settings
from tests.browser import open_page
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import DEMO_STUDY, DemoSearch, run_cli

pytestmark = pytest.mark.slow

STUDY = "traffic-demo"
WINDOW = 24
SPACE = """
knobs:
  dtype: [float32, bfloat16]
  batching: [generate, continuous]
  prefix_reuse: [auto, "off"]
rules:
  - forbid: {prefix_reuse: "off", batching: generate}
    reason: generate() keeps no prompt cache unless asked
"""


def _search(workdir: Path, env: dict[str, str], *extra: str):
    args = ["search", "--model", "demo", "--gpu", "cpu", "--study", STUDY, "--space", "space.yaml"]
    return run_cli([*args, "--traffic", "demo", "--traffic-requests", str(WINDOW), *extra], workdir, env, timeout=1200)


@pytest.fixture(scope="module")
def traced(tmp_path_factory, cache_dir):
    workdir = tmp_path_factory.mktemp("traffic-search")
    (workdir / "space.yaml").write_text(SPACE)
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(Path(__file__).parents[2])}
    completed = _search(workdir, env, "--trials", "4")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    storage = f"sqlite:///{workdir}/studies/{STUDY}.db"
    return workdir, env, completed, optuna.load_study(study_name=STUDY, storage=storage), storage


def _output_lens() -> list[int]:
    """The demo trace's first requests' output lengths where the file says them (a conversation's turn: its reply's
    tokens, which the prepared shape says)."""
    return [json.loads(line).get("output_tokens") for line in DEMO_TRACE.read_text().splitlines()[:WINDOW]]


def test_every_trial_replays_the_traces_requests_each_to_its_own_length(traced):
    _, _, completed, study, _ = traced
    settings = stored_settings(study)
    shape = settings.prepared.traffic
    assert settings.workload.traffic.requests == WINDOW and settings.workload.traffic.total == 48
    assert shape is not None and shape.requests == WINDOW
    assert [given or measured for given, measured in zip(_output_lens(), shape.output_lens, strict=True)] == list(
        shape.output_lens
    )
    complete = [record for record in records(study) if record.complete]
    assert len(complete) == 4, completed.stdout[-3000:]
    for record in complete:
        figures = record.metrics
        assert figures[REQUESTS_SERVED.name] == WINDOW
        assert figures[TOKENS_GENERATED.name] == shape.output_tokens  # each request its own length, no more
        assert figures[GOODPUT_TOKENS.name] > 0
        continuous = record.config["batching"] == "continuous"
        assert (figures[WASTED_SHARE.name] == 0) == continuous  # static batches run past a request's end
    assert {record.config["batching"] for record in complete} == {"generate", "continuous"}
    trial_lines = [line for line in completed.stdout.splitlines() if re.match(r"#\d+ \[", line)]
    assert len(trial_lines) == 4 and all("goodput" in line and "wasted" in line for line in trial_lines)


def test_goodput_leads_the_objectives_of_a_search_on_a_trace(traced):
    _, _, completed, study, _ = traced
    assert stored_settings(study).objectives[:2] == [GOODPUT_TOKENS.name, PEAK_MEMORY.name]
    assert "best goodput: requested tokens/s (within the SLO, if any): " in completed.stdout


# The traffic chart as plotly drew it: its traces' types, the bars of its histograms, the arrivals' line.
TRAFFIC_CHART = """(() => { const d = document.getElementById('fig-traffic'); return {
  types: d.data.map(t => t.type), bars: d.querySelectorAll('.barlayer path').length,
  lines: d.querySelectorAll('.scatterlayer path.js-line').length,
  said: document.querySelector('#traffic').innerText }; })()"""


def test_the_report_says_which_trace_and_charts_it_in_a_real_browser(traced, chromium):
    workdir, _, _, study, _ = traced
    page = open_page(chromium, workdir / "reports" / f"{STUDY}.html", evaluate={"traffic": TRAFFIC_CHART})
    assert page.errors == [] and page.requests == [] and page.dialogs == []
    assert page.plots == page.plot_divs
    chart = page.texts["traffic"]
    assert chart["types"] == ["histogram", "histogram", "scatter"]  # inputs, outputs, arrivals
    assert chart["bars"] > 2 and chart["lines"] == 1
    assert f"Tuned on the first {WINDOW} of 48 requests of demo-trace.jsonl (jsonl, sha256 " in chart["said"]
    assert stored_settings(study).prepared.traffic.describe() in chart["said"]


def test_another_trace_is_refused_on_resume_and_the_study_is_untouched(traced, tmp_path):
    workdir, env, _, study, storage = traced
    before = len(study.trials)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(line + "\n" for line in DEMO_TRACE.read_text().splitlines()[1 : WINDOW + 1]))
    args = ["search", "--model", "demo", "--gpu", "cpu", "--study", STUDY, "--space", "space.yaml", "--trials", "1"]
    completed = run_cli([*args, "--traffic", str(other)], workdir, env)
    assert_one_line_error(completed, f"study '{STUDY}' replays the first {WINDOW} of 48 requests of demo-trace.jsonl")
    assert f"not the {WINDOW} requests of other.jsonl" in completed.stderr
    assert len(optuna.load_study(study_name=STUDY, storage=storage).trials) == before


def test_a_worker_elsewhere_fetches_the_studys_requests_from_its_artifacts(traced, tmp_path, cache_dir):
    """A machine whose cache has no copy of the trace (the demo model linked in): the worker fetches the requests the
    study stored once, as an artifact of the study, and measures with them; given another trace, it is refused."""
    workdir, env, _, study, _ = traced
    elsewhere = tmp_path / "cache"
    elsewhere.mkdir()
    (elsewhere / "models").symlink_to(cache_dir / "models")
    (elsewhere / ".built").touch()
    other_env = {**env, "AUTOTUNE_CACHE_DIR": str(elsewhere)}
    copy = tmp_path / "search"
    shutil.copytree(workdir, copy)
    storage_copy = f"sqlite:///{copy}/studies/{STUDY}.db"
    traffic = stored_settings(study).workload.traffic
    artifacts = str(copy / "studies" / f"{STUDY}.artifacts")
    worker = ["worker", "--study", STUDY, "--storage", storage_copy, "--artifacts", artifacts]
    refused = run_cli(
        [*worker, "--trials", "1", "--traffic", str(DEMO_TRACE.with_name("prompts.jsonl"))], copy, other_env
    )
    assert refused.returncode == 2 and "prompts.jsonl" in refused.stderr
    assert not traffic.window_path(elsewhere).exists()
    completed = run_cli([*worker, "--trials", "1"], copy, other_env)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert traffic.window_path(elsewhere).read_bytes() == traffic.window_path(cache_dir).read_bytes()
    joined = [
        record for record in records(optuna.load_study(study_name=STUDY, storage=storage_copy)) if record.complete
    ]
    assert len(joined) == 5 and joined[-1].metrics[REQUESTS_SERVED.name] == WINDOW


def test_compare_refuses_another_nights_other_traffic_unless_asked(traced, demo_search: DemoSearch):
    workdir, env, _, _, storage = traced
    pair = [DEMO_STUDY, STUDY, "--storage", demo_search.storage, "--storage-b", storage]
    refused = run_cli(["compare", *pair], workdir, env)
    assert_one_line_error(refused, f"{DEMO_STUDY} replayed one shape of requests (no --traffic), {STUDY} the first")
    assert "pass --across-traffic to compare them anyway" in refused.stderr
    asked = run_cli(["compare", *pair, "--across-traffic", "--format", "json"], workdir, env)
    assert asked.returncode in (0, 3), asked.stderr[-2000:]
    assert json.loads(asked.stdout)["traffic_apart"].startswith(f"{DEMO_STUDY} replayed one shape of requests")
