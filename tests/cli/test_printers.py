"""What the commands print after a search: the front as changes from the baseline, the report, the artifacts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune.cli.measure_printers import print_measurement
from autotune.cli.printers import (
    MESSAGE_CHARS,
    TrialPrinter,
    changes_line,
    out,
    print_finished,
    print_front,
    print_search_summary,
)
from autotune.data import DEMO_TRACE
from autotune.process.results import Outcome, TaskResult
from autotune.report.data import card
from autotune.search.events import SearchSummary
from autotune.search.finish import finish
from autotune.specs import ModelSpec, WorkloadSpec
from autotune.traffic import TrafficRef, read_trace
from tests import fakes


def test_a_configuration_is_shown_as_its_changes_from_the_baseline():
    baseline = fakes.BASELINE
    assert changes_line(fakes.config("bfloat16", quantization="bnb-4bit"), baseline) == "quant=bnb-4bit"
    assert changes_line(dict(baseline), baseline) == "baseline"


def test_after_a_search_the_front_the_report_and_the_artifacts_are_printed(tmp_path: Path):
    study, url = fakes.known_study(tmp_path / "known.db")
    summary = SearchSummary(study.study_name, url, 8, "budget used up", 95.0, {})
    finished = finish(summary, tmp_path / "reports" / "known.html", None)
    assert finished.report.is_file() and finished.artifacts == str(tmp_path / "known.artifacts")
    with out.capture() as captured:
        print_finished(finished)
    printed = captured.get()
    assert "baseline: dtype=bfloat16 attn=sdpa quant=none batching=generate cache=dynamic" in printed
    rows = [line for line in printed.splitlines() if line.startswith("│ 3 ")]  # the compiled trial
    assert rows and "cache=static compile=" in rows[0] and "attn=sdpa" not in rows[0]
    assert f"report: {finished.report}" in printed
    assert f"stored as Optuna artifacts in {tmp_path / 'known.artifacts'}" in printed


def test_the_summary_names_what_the_budget_passed_over_and_why():
    summary = SearchSummary("s", "sqlite://", 5, "budget used up", 150.0, {}, passed_over=(fakes.PASSED_OVER,))
    with out.capture() as captured:
        print_search_summary(summary)
    assert f"not started, the budget left could not finish them: {fakes.PASSED_OVER}" in captured.get()


def test_the_summary_says_how_many_trials_compiled_cold_and_warm():
    spent = {"measuring": 20.0, "compiling": 40.9}
    summary = SearchSummary("s", "sqlite://", 8, "8 trials run", 90.0, spent, compiles={"warm": 5, "cold": 3})
    with out.capture() as captured:
        print_search_summary(summary)
    assert "time spent: measuring 20.0s, compiling 40.9s (3 cold, 5 warm)" in captured.get()


def test_a_compiling_trials_line_says_its_compile_time_cold_or_warm():
    from autotune.process.results import CompileFigures
    from tests.search.test_search_loop import COMPILED, record

    printer = TrialPrinter(out)
    stopped = replace(record(COMPILED, 26.2, "budget"), state="FAIL", message="stopped at the deadline")
    with out.capture() as captured:
        printer.trial_finished(stopped)
        printer.trial_finished(
            replace(stopped, duration_s=6.7, compiled=CompileFigures(graphs=1, missed=0, seconds=2.64))
        )
    lines = captured.get().splitlines()
    assert lines[0].endswith("(26.2s)") and lines[1].endswith("(6.7s, compiling 2.6s warm)")


def test_a_failed_trials_line_keeps_its_reason_whole_or_says_where_it_was_cut():
    from tests.search.test_search_loop import COMPILED, record

    why = (
        "UnsupportedError: no hub kernel could be fetched for any layer: 0 of 13 kernel-capable layers (RMSNorm, "
        "SiLU) run one on cpu; transformers maps none of them to a cpu kernel"
    )  # cut at 160 characters, it read "...maps none of them to " and stopped
    failed = replace(record(COMPILED, 0.2, "unsupported"), state="FAIL", message=f"{why}\nTraceback ...")
    endless = replace(failed, message="x" * 1000)
    with out.capture() as captured:
        TrialPrinter(out).trial_finished(failed)
        TrialPrinter(out).trial_finished(endless)
    whole, cut = captured.get().splitlines()
    assert f"-> unsupported: {why} (0.2s)" in whole and "Traceback" not in whole
    assert f"-> unsupported: {'x' * (MESSAGE_CHARS - 3)}... (0.2s)" in cut


def test_after_a_capacity_search_the_front_and_the_best_figures_say_their_capacity_and_slo(tmp_path: Path):
    from autotune.analysis.capacity import capacities
    from autotune.analysis.found import BestFound
    from autotune.figures.metrics import KL_DIVERGENCE, THROUGHPUT
    from autotune.study.opened import OpenedStudy

    study, url = fakes.capacity_study(tmp_path / "capacity.db")
    summary = SearchSummary(study.study_name, url, 5, "5 trials run", 95.0, {})
    with out.capture() as captured:
        print_finished(finish(summary, tmp_path / "reports" / "capacity.html", None))
    printed = captured.get()
    assert "each at its capacity within itl_p95<=6ms" in printed and "the baseline meets it at no" not in printed
    assert "capacity" in next(line for line in printed.splitlines() if "vs baseline" in line)  # a column
    assert next(line for line in printed.splitlines() if line.startswith("│ 2 ")).count("batch 32") == 1
    opened = OpenedStudy.of(study, url)
    records, settings = opened.records, opened.settings
    found = capacities(records, opened.terms)
    with out.capture() as captured:  # against a baseline that meets the SLO at no batch (eager fp16, #4)
        print_front("capacity", [card(records[2], settings, records[4], found)], baseline=records[4].config)
    assert "; the baseline meets it at no batch: vs baseline compares with its figures past it" in captured.get()
    best = (BestFound(THROUGHPUT, 2, 2283.3, 1.5, 1), BestFound(KL_DIVERGENCE, 0, 0.0, 0.2, 1))
    with out.capture() as captured:
        print_search_summary(replace(summary, best=best), "within itl_p95<=6ms")
    lines = captured.get().splitlines()
    assert "best decode throughput: 2283 tok/s at its capacity within itl_p95<=6ms, found by trial #2" in lines[2]
    # quality is forced through the generation at the capacity's batch: at its capacity too
    assert lines[3].startswith("best KL divergence vs reference: 0 nats/token at its capacity within itl_p95<=6ms")


def test_measure_says_which_requests_of_which_trace_it_replayed():
    window = TrafficRef.of(read_trace(DEMO_TRACE), 8)
    result = TaskResult(Outcome.OK, metrics={"goodput_tok_s": 1000.0, "requests_served": 8.0})
    with out.capture() as captured:
        print_measurement(ModelSpec("demo"), WorkloadSpec(batch_size=2, traffic=window), fakes.BASELINE, result, False)
    printed = " ".join(captured.get().split())  # as one line, however the console wrapped it
    said = f"workload: throughput, the first 8 of 48 requests of demo-trace.jsonl (jsonl, sha256 {window.sha256[:8]}),"
    assert f"{said} 2 requests at a time through generate() (continuous batching: all at once), each with its own" in (
        printed
    )
    assert "requests_served: 8" in printed
