"""Which configurations `autotune evaluate` chooses (autotune.search.evaluate), on a known study whose answers are
stored as a search stores them: best's pick, and while the task's own bounds reject each one evaluated, the next in
best's order; trials by number, refused in one line when they cannot be evaluated."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import NothingSatisfiesError, UserError
from autotune.figures.constraints import parse_constraints
from autotune.search.evaluate import EvaluateRequest, _chooser
from autotune.specs import StorageSpec, WorkerRequest
from autotune.study.evaluations import store_answers, store_task
from autotune.study.opened import OpenedStudy
from tests import fakes

ITEMS = 100
REFERENCE = {f"demo/{item}": item % 4 == 0 for item in range(ITEMS)}  # 25% right


def flipping(count: int) -> dict[str, bool]:
    """The reference's answers with the first `count` items answered the other way."""
    return {item: (not right) if index < count else right for index, (item, right) in enumerate(REFERENCE.items())}


@pytest.fixture
def opened(tmp_path: Path) -> OpenedStudy:
    study, url = fakes.known_study(tmp_path / "known.db")
    reference = {"answers": REFERENCE, "seconds": 1.0}
    store_task(study, {"task": "demo", "limit": None, "metric": "exact_match", "reference": reference})
    return OpenedStudy.of(study, url)


def request(*constraints: str, trials: tuple[int, ...] = ()) -> EvaluateRequest:
    worker = WorkerRequest(StorageSpec("known", "sqlite:///unused.db"))
    return EvaluateRequest(worker, trials, tuple(parse_constraints(list(constraints))))


def chosen_numbers(evaluate: EvaluateRequest, opened: OpenedStudy) -> list[int]:
    chooser, _ = _chooser(evaluate, opened)
    fresh = OpenedStudy.of(opened.study, opened.storage_url)  # as the study is at the next turn
    return [record.number for record in chooser(fresh)]


def test_best_s_pick_then_the_next_in_its_order_while_the_task_bounds_reject_each_one_evaluated(opened):
    gate = request("memory<=2.1GB", "flips<=0.05")  # best's order within 2.1 GB: #1 (200 tok/s), #2 and #4 (150)
    assert chosen_numbers(gate, opened) == [1, 2, 4]  # none evaluated: the first is taken first
    store_answers(opened.study, 1, {"answers": flipping(10), "seconds": 1.0, "path": "decode"})  # 10% flipped
    assert chosen_numbers(gate, opened) == [1, 2, 4]  # #1 evaluated and rejected: #2 is next
    store_answers(opened.study, 2, {"answers": flipping(1), "seconds": 1.0, "path": "decode"})  # 1% flipped
    assert chosen_numbers(gate, opened) == [1, 2]  # #2 meets every bound: best picks it, nothing after it is asked


def test_without_bounds_on_the_task_best_s_pick_alone(opened):
    assert chosen_numbers(request("memory<=2.1GB"), opened) == [1]
    with pytest.raises(NothingSatisfiesError, match="decode throughput >= 1e\\+09 tok/s cuts the last"):
        chosen_numbers(request("throughput>=1e9", "flips<=0.05"), opened)


def test_trials_by_number_and_those_that_cannot_be_evaluated_refused(opened):
    assert chosen_numbers(request(trials=(4, 0)), opened) == [4, 0]
    with pytest.raises(UserError, match="--trial 42: study fake has no trial #42"):
        chosen_numbers(request(trials=(42,)), opened)
    with pytest.raises(UserError, match="--trial 5: it ended oom; only a complete trial can be evaluated"):
        chosen_numbers(request(trials=(5,)), opened)
