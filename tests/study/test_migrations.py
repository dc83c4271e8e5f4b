"""Older stored forms read as today's (autotune/study/migrations.py): a capacity that carried its sentence and no stop,
a serve load that held the SLO, a profile without its kind, a kept result's blame; and the studies written by main
8b80113, opened in one place (autotune/study/opened.py), showing what they stored."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from autotune.figures.capacity import LARGEST, Capacity, Probe, Stop
from autotune.process.results import Blame, Outcome, TaskResult
from autotune.space.plan import WorkerHook
from autotune.study import migrations
from autotune.study.opened import OpenedStudy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "studies_8b80113"
LEVEL = {"requests": 16.0, "errors": 0.0, "requests_per_s": 10.0, "goodput_req_s": 9.0, "output_tok_s": 160.0}


def test_a_capacity_stored_with_its_sentence_shows_the_same_sentence_and_gains_its_stop():
    probe = Probe([8], {"itl_p95_s": 0.005})
    probe.record(8, {"itl_p95_s": 0.006})
    stored = {
        **probe.capacity().to_json(),
        "said": "meets the SLO at no batch: batch 8 past the SLO: itl_p95 6 ms > 5 ms",
    }
    del stored["stopped"], stored["unit"]  # as the first capacities were stored: no stop, no unit
    capacity = Capacity.from_json(migrations.capacity(stored))
    assert capacity.unit.name == "batch" and capacity.stopped == Stop(8, "slo")
    assert capacity.found() == stored["said"]
    assert "said" not in capacity.to_json()


def test_a_serve_capacity_stored_with_its_sentence_shows_the_same_sentence():
    probe = Probe([4.0, 8.0, 16.0], {"ttft_p95_s": 0.3}, refine=2, whole=False, share=0.95)
    for rate, within in ((4.0, 1.0), (8.0, 1.0), (16.0, 0.5), (12.0, 1.0), (14.0, 13 / 16)):
        probe.record(rate, {**LEVEL, "slo_share": within})
    stored = {key: value for key, value in probe.capacity("rate").to_json().items() if key != "stopped"}
    stored["said"] = (
        "rate 12 is the highest sustained (95% of requests within the SLO); "
        "rate 14 past the SLO: 13 of 16 requests within it (81.2%) < 95%"
    )
    capacity = Capacity.from_json(migrations.capacity(stored))
    assert capacity.stopped == Stop(14.0, "slo") and capacity.target.share == 0.95
    assert capacity.found() == stored["said"]
    assert capacity.shown() == {
        **{key: stored[key] for key in ("slo", "points", "unit", "share")},
        "said": stored["said"],
    }


def test_a_serve_load_that_held_the_slo_and_a_profile_without_its_kind_read_as_today():
    stored = {"kind": "serve", "serve": {"mode": "rate", "levels": [1.0, 2.0], "slo": {"ttft_p95_s": 0.5}}}
    workload = migrations.workload(stored)
    assert workload["slo"] == {"ttft_p95_s": 0.5} and "slo" not in workload["serve"]
    assert migrations.profile({"name": "a10g"})["kind"] == "cuda"
    assert migrations.profile({"name": "cpu", "kind": "cpu"})["kind"] == "cpu"
    assert migrations.objectives(None) == ["throughput_tok_s", "peak_memory_gb", "kl_divergence"]


def test_a_result_kept_before_the_blame_was_a_type_is_read_with_its_blame_and_its_plan_as_today():
    """A result kept on disk by main f92f638 (study/kept.py), stored by a later version: the value a failure points at
    as `excludes` or `suspects`, and the plan its worker ran as such plans were stored."""
    refused = {"outcome": "unsupported", "excludes": {"knob": "quantization", "value": "torchao-int8"}}
    suspected = {"outcome": "error", "suspects": {"knob": "compile", "value": "default"}}
    assert TaskResult.from_json(migrations.kept_result(refused)).blame == Blame("quantization", "torchao-int8", True)
    assert TaskResult.from_json(migrations.kept_result(suspected)).blame == Blame("compile", "default", False)
    adapted = {"load": {}, "generate": {}, "batching": "generate", "continuous": {}, "decode_loop": "fused-step"}
    ran = TaskResult.from_json(migrations.kept_result({"outcome": "ok", "details": {"plan": adapted}})).details.plan
    loop = WorkerHook("autotune.worker.decode_loops", "fused-step")
    assert ran is not None and ran.worker_hooks == {"decode_loop": loop}
    today = TaskResult(Outcome.OOM, blame=Blame("dtype", "float32", False)).to_json()
    assert migrations.kept_result(today) == today


def test_the_capacity_study_of_8b80113_shows_the_sentences_it_stored(tmp_path: Path):
    shutil.copy(FIXTURE / "studies.db", tmp_path / "studies.db")
    stored = _stored_capacities(tmp_path / "studies.db")
    opened = OpenedStudy.open("capacity", f"sqlite:///{tmp_path / 'studies.db'}")
    probed = [record for record in opened.records if record.capacity is not None]
    assert len(probed) == len(stored) == 3
    for record in probed:
        assert record.capacity.found() == stored[record.number]["said"]
        assert record.capacity.stopped == Stop(4, LARGEST)
    assert opened.settings.device_type == "cpu" and opened.terms.device == "CPU"
    assert opened.front and {record.number for record in opened.front} == opened.front_numbers


def _stored_capacities(path: Path) -> dict[int, dict]:
    """trial number -> its capacity as 8b80113 stored it, read past autotune."""
    query = (
        "SELECT t.number, a.value_json FROM trial_user_attributes a JOIN trials t ON t.trial_id = a.trial_id "
        "JOIN studies s ON s.study_id = t.study_id WHERE a.key = 'capacity' AND s.study_name = 'capacity'"
    )
    with sqlite3.connect(path) as connection:
        return {number: json.loads(value) for number, value in connection.execute(query)}
