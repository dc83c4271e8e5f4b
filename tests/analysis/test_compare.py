"""autotune compare: two stored studies, a planted regression, exit status 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune import study as studies
from autotune.analysis.compare import DEFAULT_TOLERANCES, Tolerances, compare
from autotune.figures.capacity import SloTarget
from autotune.study import front_numbers
from autotune.study.opened import Terms
from tests import fakes
from tests.conftest import run_cli, run_main

GPU = DEFAULT_TOLERANCES["cuda"]


def nightly(path: Path, name: str, speed: float = 1.0, memory: float = 1.0):
    """A night's study: the same configurations, with throughput and memory scaled."""
    study, url = fakes.new_study(path, name=name)
    for cfg, throughput, memory_gb, kl in (
        (fakes.REFERENCE, 100, 4.0, 0.0),
        (fakes.BASELINE, 200, 2.0, 0.001),
        (fakes.COMPILED, 400, 2.2, 0.001),
        (fakes.FOUR_BIT, 150, 1.0, 0.05),
    ):
        fakes.add_complete(study, cfg, fakes.metrics(throughput * speed, memory_gb * memory, kl, 0.99, 10.0))
    return study, url


def test_figures_moved_and_levels_of_the_front():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        a, _ = nightly(Path(folder) / "a.db", "a")
        b, _ = nightly(Path(folder) / "b.db", "b", speed=0.8)
        result = compare(studies.records(a), front_numbers(a), studies.records(b),
                         front_numbers(b), GPU)  # fmt: skip
    compiled = next(m for m in result.movements if m.config == fakes.COMPILED)
    assert compiled.on_front == ("A", "B")
    assert compiled.change["throughput_tok_s"] == pytest.approx(-0.2)
    assert compiled.change["peak_memory_gb"] == pytest.approx(0.0)
    assert {level.throughput_before for level in result.levels} == {100, 200, 400, 150}
    assert all(level.regression() == pytest.approx(0.2) for level in result.levels)
    assert len(result.regressed) == 4


def test_a_faster_but_bigger_configuration_does_not_hide_a_regression(tmp_path):
    a, _ = nightly(tmp_path / "a.db", "a")
    b, _ = nightly(tmp_path / "b.db", "b", speed=1.5, memory=1.5)  # faster, but 50% more memory everywhere
    result = compare(studies.records(a), front_numbers(a), studies.records(b),
                     front_numbers(b), GPU)  # fmt: skip
    assert result.regressed  # nothing in B fits A's memory levels
    assert {level.regressed_figure(GPU) for level in result.regressed} == {"memory"}
    miss = result.regressed[0].nearest_miss
    assert miss is not None and miss.over == {"memory": pytest.approx(0.5)}


def test_planted_regression_exits_3_and_a_study_against_itself_exits_0(tmp_path: Path, cli_env):
    _, url = nightly(tmp_path / "nights.db", "night-1")
    nightly(tmp_path / "nights.db", "night-2", speed=0.9)  # 10% slower everywhere
    nightly(tmp_path / "nights.db", "night-3", speed=0.98)  # 2%: noise, under the 5% threshold

    regressed = run_cli(["compare", "night-1", "night-2", "--storage", url], tmp_path, cli_env, timeout=120)
    assert regressed.returncode == 3, regressed.stdout + regressed.stderr
    assert "REGRESSED throughput: at " in regressed.stdout and "(-10.0%; a loss over 5% regresses)" in regressed.stdout

    same = run_cli(["compare", "night-1", "night-1", "--storage", url], tmp_path, cli_env, timeout=120)
    assert same.returncode == 0, same.stdout + same.stderr
    within = run_cli(["compare", "night-1", "night-3", "--storage", url], tmp_path, cli_env, timeout=120)
    assert within.returncode == 0, within.stdout
    stricter = run_cli(["compare", "night-1", "night-3", "--storage", url, "--threshold", "1%"], tmp_path, cli_env)
    assert stricter.returncode == 3

    as_json = run_cli(["compare", "night-1", "night-2", "--storage", url, "--json"], tmp_path, cli_env, timeout=120)
    document = json.loads(as_json.stdout)
    assert as_json.returncode == 3 and document["regressed"] is True
    assert {round(level["regression"], 3) for level in document["levels"]} == {0.1}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "night-1", "nope"], "no study named 'nope'"),
        (["compare", "night-1", "night-1", "--threshold", "lots"], "--threshold 'lots'"),
    ],
)
def test_bad_compare_input(tmp_path: Path, cli_env, args, message):
    _, url = nightly(tmp_path / "nights.db", "night-1")
    completed = run_cli([*args, "--storage", url], tmp_path, cli_env, timeout=120)
    assert completed.returncode == 2 and message in completed.stderr and "Traceback" not in completed.stderr


def test_memory_that_moved_says_memory_with_signs_that_match(tmp_path: Path, cli_env):
    _, url = nightly(tmp_path / "nights.db", "night-1")
    nightly(tmp_path / "nights.db", "faster-bigger", speed=4.0, memory=1.10)  # 4x faster, 10% more memory
    completed = run_cli(["compare", "night-1", "faster-bigger", "--storage", url], tmp_path, cli_env, timeout=120)
    assert completed.returncode == 3, completed.stdout + completed.stderr
    lines = [line for line in completed.stdout.splitlines() if line.startswith("REGRESSED")]
    assert lines and all(line.startswith("REGRESSED memory: at ") for line in lines), completed.stdout
    assert "reaches 600.0 tok/s (+300.0%) but its memory is +10.0% (1.10 GB vs 1.00 GB, tolerance +5%)" in (
        completed.stdout
    )
    assert "nothing fits" not in completed.stdout and "-100.0%" not in completed.stdout
    loose = run_cli(["compare", "night-1", "faster-bigger", "--storage", url, "--memory-tolerance", "15%"],
                    tmp_path, cli_env, timeout=120)  # fmt: skip
    assert loose.returncode == 0, loose.stdout
    assert "ok: at 2.20 GB and KL 1.00e-03" in loose.stdout and "400.0 -> 1600.0 tok/s (+300.0%;" in loose.stdout
    assert "ok: at 2.00 GB" in loose.stdout and "200.0 -> 800.0 tok/s (+300.0%;" in loose.stdout
    assert "tolerances: throughput -5%, memory +15%, KL +10%" in loose.stdout


def test_a_cpu_study_gets_tolerances_above_cpu_noise(tmp_path):
    cpu, gpu = DEFAULT_TOLERANCES["cpu"], DEFAULT_TOLERANCES["cuda"]
    assert cpu.memory > 0.10 and cpu.throughput > 0.20  # the run-to-run noise measured on CPU (docs/deploy.md)
    assert gpu == Tolerances(0.05, 0.05, 0.10)


# ------------------------------------------------------------------------------------------------ capacity


def capacity_nights(path: Path) -> str:
    """Three throughput studies that probed batches 1-64: night-2 20% slower at the same batches, night-3 searched
    within another SLO."""
    _, url = fakes.capacity_study(path, "night-1")
    fakes.capacity_study(path, "night-2", speed=0.8)
    fakes.capacity_study(path, "night-3", slo={"itl_p95_s": 0.004})
    return url


def terms_of(*studied) -> tuple[Terms, ...]:
    return tuple(Terms.of(studies.stored_settings(study)) for study in studied)


def test_studies_within_the_same_slo_compare_their_figures_at_capacity(tmp_path: Path):
    url = capacity_nights(tmp_path / "nights.db")
    a, b = (studies.load_stored_study(url, name) for name in ("night-1", "night-2"))
    result = compare(studies.records(a), front_numbers(a), studies.records(b), front_numbers(b), GPU, terms_of(a, b))
    assert result.not_compared is None and result.target == SloTarget(fakes.CAPACITY_SLO)
    compiled = next(m for m in result.movements if m.config == fakes.COMPILED)
    assert compiled.before["capacity"] == compiled.after["capacity"] == 32 and compiled.change["capacity"] == 0
    assert compiled.change["throughput_tok_s"] == pytest.approx(-0.2)
    level = next(level for level in result.levels if level.config == fakes.COMPILED)
    assert level.regressed_figure(GPU) == "throughput"  # 20% less at the same capacity
    assert (level.at_capacity_before.size, level.at_capacity_after.size) == (32, 32)
    assert level.at_capacity_after.tokens_per_s == pytest.approx(0.8 * level.at_capacity_before.tokens_per_s)


def test_studies_within_different_slos_are_not_compared_and_the_command_says_why(tmp_path: Path, cli_env):
    url = capacity_nights(tmp_path / "nights.db")
    a, c = (studies.load_stored_study(url, name) for name in ("night-1", "night-3"))
    result = compare(studies.records(a), front_numbers(a), studies.records(c), front_numbers(c), GPU, terms_of(a, c))
    assert result.not_compared == (
        "the earlier was searched within itl_p95<=6ms, the later within itl_p95<=4ms: "
        "figures at capacity do not compare"
    )
    assert result.movements == [] and result.levels == [] and not result.regressed
    completed = run_main(["compare", "night-1", "night-3", "--storage", url], tmp_path, cli_env)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr == (
        f"autotune: error: night-1 and night-3 do not compare: {result.not_compared}; compare studies searched with "
        "the same --slo (autotune best prints each one's)\n"
    )


def test_compare_prints_capacity_beside_the_slo_it_holds_within(tmp_path: Path, cli_env):
    url = capacity_nights(tmp_path / "nights.db")
    table = run_main(["compare", "night-1", "night-2", "--storage", url], tmp_path, cli_env)
    assert table.returncode == 3, table.stdout + table.stderr
    assert "at each one's capacity within itl_p95<=6ms (both studies)" in table.stdout
    assert "capacity" in table.stdout.split("\n")[2]  # a column of the table's header
    compiled = fakes.STACKS["compiled"].figures(32)["e2e_throughput_tok_s"]
    assert (
        f"; at capacity within itl_p95<=6ms: batch 32 -> batch 32, {compiled:.4g} -> {0.8 * compiled:.4g} generated "
        "tok/s end to end per GPU, $"
    ) in table.stdout
    markdown = run_main(["compare", "night-1", "night-2", "--storage", url, "--format", "markdown"], tmp_path, cli_env)
    assert "Figures at each configuration's capacity within itl_p95&lt;=6ms." in markdown.stdout
    assert "| configuration | front | tok/s | ttft | memory | KL | tokens | capacity |" in markdown.stdout
    as_json = run_main(["compare", "night-1", "night-2", "--storage", url, "--json"], tmp_path, cli_env)
    document = json.loads(as_json.stdout)
    assert document["slo"] == fakes.CAPACITY_SLO and document["within"] == "within itl_p95<=6ms"
    level = next(level for level in document["levels"] if level["config"] == fakes.COMPILED)
    assert level["at_capacity_before"]["capacity"] == 32 and level["at_capacity_after"]["device"] == "GPU"
