import itertools

import pytest

from autotune.figures.stats import Summary, percentile
from autotune.units import format_bytes, parse_duration
from autotune.worker.measurement.timing import repeat_until


def test_summary_of_known_values():
    summary = Summary.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert summary.n == 5
    assert summary.mean == 3.0
    assert summary.p50 == 3.0
    assert summary.p95 == pytest.approx(4.8)
    assert summary.stdev == pytest.approx(1.5811388)
    assert summary.cv == pytest.approx(1.5811388 / 3)


def test_percentile_matches_numpy_linear_method():
    numpy = pytest.importorskip("numpy")
    values = sorted([0.3, 9.1, 4.4, 4.5, 1.2, 7.7, 2.0])
    for q in (0, 10, 50, 90, 95, 100):
        assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)))


def test_repeat_until_needs_both_iterations_and_time():
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731 - one tick per call
    calls = repeat_until(lambda: 1, min_iterations=2, min_seconds=10, max_iterations=100, clock=clock)
    assert len(calls) >= 2
    ticks = itertools.count()
    assert len(repeat_until(lambda: 1, min_iterations=5, min_seconds=0, max_iterations=100, clock=clock)) == 5
    assert len(repeat_until(lambda: 1, min_iterations=5, min_seconds=1e9, max_iterations=7, clock=clock)) == 7


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5h", 5400), ("45", 45)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-3m", "0s", "m"])
def test_bad_durations_are_user_errors(text):
    from autotune.errors import UserError

    with pytest.raises(UserError, match="--budget"):
        parse_duration(text)


def test_format_bytes():
    assert format_bytes(1_500_000_000) == "1.50 GB"
    assert format_bytes(2_500_000) == "2.50 MB"
    assert format_bytes(None) == "-"
