"""A throughput search whose trials probe batch sizes, through the real worker on the demo model.

One search of two trials: the reference (float32) climbs 1, 4 and 16 and skips 1024, which the memory of the two below
predicts to be over the study's memory bound; the baseline (bfloat16) runs out of memory at batch 4 (injected, as a
GPU's allocator would refuse it), so the probe ends there and the trial keeps batch 1. Its report, opened in headless
Chromium, draws each front configuration's curve.

The prediction is a line through the peaks of 4 and 16, which a CPU measures to within a megabyte or so: at 1, 2 and 4
with 64-token prompts (about a megabyte apart) the peaks once came out 20.4, 19.5 and 19.3 MB, a falling line, and 512
ran. With 128-token prompts, 4 and 16 are about 20 MB apart (23.5 and 43.5 MB measured), and 16 is well within 60 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from autotune.report.data import collect
from autotune.study import records
from tests.browser import open_page
from tests.conftest import BRIEF, REPO, run_cli

pytestmark = pytest.mark.slow

STUDY = "probe"
SHAPE = ["--input-len", "128", "--output-len", "16", "--batch-size", "1,4,16,1024", *BRIEF]
ARGS = ["search", "--model", "demo", "--gpu", "cpu", "--trials", "2", "--study", STUDY, *SHAPE,
        "--slo", "itl_p95<=10s", "--constraint", "memory<=60MB"]  # fmt: skip
OOM_FROM_BATCH_4 = {"dtype=bfloat16": {"phase": "measure", "kind": "oom", "batch": 4}}


@dataclass(frozen=True)
class ProbeSearch:
    workdir: Path
    completed: subprocess.CompletedProcess

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.workdir}/studies/{STUDY}.db"

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=STUDY, storage=self.storage)


@pytest.fixture(scope="module")
def probe_search(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> ProbeSearch:
    workdir = tmp_path_factory.mktemp("probe")
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    env["AUTOTUNE_INJECT_FAULTS"] = json.dumps(OOM_FROM_BATCH_4)
    completed = run_cli(ARGS, workdir, env, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return ProbeSearch(workdir, completed)


def test_a_probe_skips_a_batch_predicted_not_to_fit_and_an_oom_ends_it_keeping_the_batches_below(
    probe_search: ProbeSearch,
):
    completed = probe_search.completed
    reference, baseline = sorted((r for r in records(probe_search.study()) if r.launched), key=lambda r: r.number)

    assert reference.complete and reference.capacity is not None
    sizes = [(point.size, point.verdict) for point in reference.capacity.points]
    assert sizes == [(1, "met"), (4, "met"), (16, "met"), (1024, "memory")]
    skipped = reference.capacity.points[-1]
    assert skipped.figures == {} and skipped.reason.startswith("predicted peak ")  # never run
    assert skipped.reason.endswith("> 60.00 MB, not run")
    assert reference.metrics["capacity"] == 16 and reference.metrics["meets_slo"] == 1
    assert reference.feasible

    assert baseline.complete, baseline.message  # the probe's OOM is the end of its bracket, not a failed trial
    sizes = [(point.size, point.verdict) for point in baseline.capacity.points]
    assert sizes == [(1, "met"), (4, "oom")]
    assert "can't allocate memory" in baseline.capacity.points[-1].reason
    assert baseline.metrics["capacity"] == 1
    assert baseline.capacity.found() == (
        f"batch 1 is the largest within the SLO; batch 4 out of memory: {baseline.capacity.points[-1].reason}"
    )
    # the search's trial lines print each point and why the probe stopped climbing
    assert "batch 4: refused: RuntimeError" in completed.stdout
    assert "capacity within itl_p95<=10s: batch 1 is the largest within the SLO" in completed.stdout


# Each capacity figure as plotly drew it (tests/report/test_report_browser.py reads the same): its traces, and per
# trace drawn in its SVG, its points and line paths.
CURVES = """[...document.querySelectorAll('[id^=fig-capacity-]')].map(d => ({
  id: d.id,
  drawn: Object.fromEntries([...d.querySelectorAll('.scatterlayer .trace')].map(t => [t.__data__[0].trace.name, [
    t.querySelectorAll('path.point').length, t.querySelectorAll('path.js-line').length]])),
}))"""


def test_the_report_draws_each_front_configurations_curve_with_its_slo_and_its_capacity(
    probe_search: ProbeSearch, chromium: str
):
    data = collect(probe_search.study(), probe_search.storage)
    report = probe_search.workdir / "reports" / f"{STUDY}.html"
    page = open_page(chromium, report, evaluate={"curves": CURVES})
    assert page.errors == [] and page.requests == [] and page.dialogs == []
    assert data.cards and page.plots == page.plot_divs
    curves = {curve["id"]: curve["drawn"] for curve in page.texts["curves"]}
    assert sorted(curves) == sorted(f"fig-capacity-{card.record.number}" for card in data.cards)
    for card in data.cards:
        drawn, curve = curves[f"fig-capacity-{card.record.number}"], card.curve
        measured = len(curve.points) - len(curve.unmeasured)
        assert drawn["decode throughput (tokens/s)"] == [measured, 1]
        assert drawn["SLO itl_p95<=10s"] == [0, 1]  # the SLO's line across the latency axis
        assert drawn[f"capacity: batch {curve.chosen.size:g}"] == [1, 0]  # the chosen point
        assert drawn["refused, not measured"] == [1, 0]  # 1024 predicted not to fit, or 4 out of memory
        assert f"batch_size = {curve.chosen.size:g}  #" in card.python
