"""When each objective's best figure was found: trial number, search run and minutes into it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from autotune.analysis.found import best_found
from autotune.figures.metrics import KL_DIVERGENCE, OBJECTIVES, PEAK_MEMORY, THROUGHPUT
from autotune.study import TrialRecord

START = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def record(number: int, minutes: float, throughput: float, memory: float, kl: float, feasible: bool = True):
    finished = (START + timedelta(minutes=minutes)).astimezone().replace(tzinfo=None)  # as Optuna stores it
    metrics = {THROUGHPUT.name: throughput, PEAK_MEMORY.name: memory, KL_DIVERGENCE.name: kl}
    return TrialRecord(
        number=number, state="COMPLETE", config={}, roles=(), outcome="ok", message="", phase=None, metrics=metrics,
        timings={}, environment={}, plan=None, skipped=None, duration_s=10.0, pid=None, log_tail="",
        constraints={"kl": 0.0 if feasible else 1.0}, finished_at=finished,
    )  # fmt: skip


def run(started_minutes: float, elapsed_minutes: float) -> dict:
    finished = START + timedelta(minutes=started_minutes + elapsed_minutes)
    return {"finished_at": finished.isoformat(timespec="seconds"), "elapsed_s": elapsed_minutes * 60}


def test_each_objective_names_the_first_trial_with_its_best_and_the_minute_it_was_found():
    records = [
        record(0, 1.0, 100, 2.0, 0.0),
        record(1, 2.5, 300, 1.0, 1e-4),
        record(2, 4.0, 300, 3.0, 1e-3),  # as fast as #1, later: #1 found it
        record(3, 5.0, 900, 0.5, 0.5, feasible=False),  # outside the constraints: never the best
    ]
    found = {f.metric.name: f for f in best_found(records, OBJECTIVES, [run(0, 6)])}
    assert (found[THROUGHPUT.name].number, found[THROUGHPUT.name].value) == (1, 300)
    assert abs(found[THROUGHPUT.name].minutes - 2.5) < 0.05 and found[THROUGHPUT.name].run == 1
    assert found[PEAK_MEMORY.name].number == 1 and found[KL_DIVERGENCE.name].number == 0


def test_a_best_from_an_earlier_run_says_which_run_and_an_unrecorded_one_says_nothing_of_time():
    records = [record(0, 1.0, 100, 2.0, 0.0), record(5, 62.0, 500, 2.0, 0.0)]
    found = best_found(records, OBJECTIVES[:1], [run(0, 10), run(60, 10)])[0]
    assert (found.number, found.run) == (5, 2) and abs(found.minutes - 2.0) < 0.05
    unknown = best_found(records, OBJECTIVES[:1], [])[0]
    assert unknown.number == 5 and unknown.minutes is None and unknown.run is None


def test_no_complete_trial_no_best():
    assert best_found([], OBJECTIVES, [run(0, 1)]) == []
