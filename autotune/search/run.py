"""Running a search: in this process, as a worker joining a study, or as one worker per device.

The study process never imports torch; every model-touching step runs in a worker subprocess.
Several workers share a study through its storage (Optuna's distributed mode: an RDB storage with
heartbeats, plus autotune's claims), whether they run on one machine or many.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna

from autotune import for_tests
from autotune import study as studies
from autotune.analysis.found import best_found
from autotune.errors import UserError
from autotune.extras import EVAL, why_missing
from autotune.measure.prepare import Prepared, machine_notes, prepare
from autotune.process import phases
from autotune.process.life import child_environment
from autotune.profiles import detect_gpu
from autotune.search.evaluation import (
    EVALUATING,
    ReferenceEvaluation,
    evaluate_finalists,
    evaluate_reference,
    front_evaluated,
    reserved_s,
)
from autotune.search.events import SearchEvents, SearchSummary
from autotune.search.interrupts import Interrupted, deferred
from autotune.search.loop import TrialLoop
from autotune.search.session import Checked, Session, check_search, check_worker, open_session
from autotune.space.knobs import DeviceType
from autotune.specs import BudgetSpec, SearchRequest, WorkerRequest
from autotune.study.evaluations import store_task
from autotune.study.opened import OpenedStudy


def run_search(request: SearchRequest, events: SearchEvents) -> SearchSummary:
    """Prepare, then measure configurations until the trial limit, the budget or the space runs out."""
    if request.devices:
        return _run_on_devices(request, events)
    started = time.monotonic()
    deadline = request.budget.deadline(started)
    checked = _check(request, events)
    with checked.named_on_interrupt():
        prepared = _prepare(checked, deadline, events)
        reference = _evaluate_reference(checked, prepared, deadline, events) if request.evaluation else None
        session = open_session(checked, prepared, events)
        if reference is not None and reference.new:
            store_task(session.study, reference.stored)
        loop_deadline = deadline - reserved_s(reference, deadline) if reference and deadline else deadline
        summary = _run_loop(TrialLoop(session, loop_deadline, events), started)
        if reference is not None:
            summary = _with_finalists(summary, reference, evaluate_finalists(session, reference, deadline, events))
    for_tests.hold("front")
    studies.record_search_run(session.study, _run_record(request, summary))
    return _with_best(summary, session.study)


def _with_finalists(summary: SearchSummary, reference: ReferenceEvaluation, lines: tuple[str, ...]) -> SearchSummary:
    """The summary with tier 1's lines, and its time: the reference's evaluation (counted as preparing until now) and
    the finalists' (after the loop)."""
    finalists_s = time.monotonic() - summary.ended
    spent = dict(summary.spent_s)
    own = reference.seconds if reference.new else 0.0
    spent["preparing"] = max(0.0, spent.get("preparing", 0.0) - own)
    spent[EVALUATING] = own + finalists_s
    return replace(summary, evaluation=lines, spent_s=spent, elapsed_s=summary.elapsed_s + finalists_s)


def _evaluate_reference(
    checked: Checked, prepared: Prepared, deadline: float | None, events: SearchEvents
) -> ReferenceEvaluation:
    """Tier 1's reference, before the study is created: a task that cannot be loaded here leaves nothing behind."""
    try:
        return evaluate_reference(checked.request, prepared, checked.existing, checked.workdir, deadline, events)
    except UserError:
        if checked.existing is None:
            shutil.rmtree(checked.workdir, ignore_errors=True)
        raise


def _check(request: SearchRequest, events: SearchEvents) -> Checked:
    """The inputs checked, with a note for each value left out for what this machine answered."""
    events.progress("checking the hardware, the search space and the study")
    checked = check_search(request, events)
    for line in machine_notes(checked.space):
        events.note(line)
    return checked


def _with_best(summary: SearchSummary, study: optuna.Study) -> SearchSummary:
    """The summary, with when each objective's best figure was found."""
    opened = OpenedStudy.of(study, summary.storage_url)
    found = best_found(opened.records, opened.settings.objective_metrics, opened.runs)
    return replace(summary, best=tuple(found))


def join_study(worker: WorkerRequest, events: SearchEvents) -> SearchSummary:
    """`autotune worker`: take trials of an existing study, with its model, space, workload and reference; then, where
    the study was searched with --eval, the front's finalists no other process has evaluated, each claimed."""
    started = time.monotonic()
    deadline = worker.budget.deadline(started)
    events.progress("reading the study")
    checked, reference = check_worker(worker, events)
    with checked.named_on_interrupt():
        prepared = prepare(
            checked.request, checked.hardware, checked.space, checked.workdir, deadline, reference, _preparing(events)
        )
        session = open_session(checked, prepared, events)
        task = _task_here(session, events)
        loop_deadline = deadline - reserved_s(task, deadline) if task and deadline else deadline
        summary = _run_loop(TrialLoop(session, loop_deadline, events), started)
        if task is not None:
            summary = _with_finalists(summary, task, evaluate_finalists(session, task, deadline, events))
        return summary


def _task_here(session: Session, events: SearchEvents) -> ReferenceEvaluation | None:
    """The study's task (tier 1), where it has one and this machine can evaluate it (lm-evaluation-harness)."""
    task = ReferenceEvaluation.stored_in(session.study)
    if task is not None and (missing := why_missing("the study's --eval", EVAL)):
        events.note(f"{missing}; this worker leaves the finalists' evaluations to the study's other processes")
        return None
    return task


def _preparing(events: SearchEvents) -> Callable[[str], None]:
    return lambda name: events.progress(f"preparing: {phases.label(name)}")


def _prepare(checked: Checked, deadline: float | None, events: SearchEvents) -> Prepared:
    try:
        request = checked.request
        return prepare(request, checked.hardware, checked.space, checked.workdir, deadline, None, _preparing(events))
    except UserError:
        if checked.existing is None:  # bad input leaves nothing behind
            shutil.rmtree(checked.workdir, ignore_errors=True)
        raise


def _run_loop(loop: TrialLoop, started: float) -> SearchSummary:
    loop.spending.add("preparing", time.monotonic() - started)
    stop_reason = loop.run()
    elapsed = time.monotonic() - started
    loop.spending.add("between trials (sampling, storing)", elapsed - sum(loop.spending.seconds.values()))
    session = loop.session
    passed_over = tuple(loop.passed_over.values())
    summary = SearchSummary(
        session.name, session.storage_url, loop.launched, stop_reason, elapsed, loop.spending.seconds
    )
    return replace(summary, passed_over=passed_over, ended=time.monotonic(), compiles=dict(loop.spending.compiles))


def _run_record(request: SearchRequest, summary: SearchSummary) -> dict[str, Any]:
    """What the report's "budget used" needs, stored with the study."""
    return {
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "budget_s": request.budget.budget_s,
        "max_trials": request.budget.max_trials,
        "launched": summary.launched,
        "elapsed_s": summary.elapsed_s,
        "spent_s": summary.spent_s,
        "compiles": summary.compiles,
        "stop_reason": summary.stop_reason,
        "passed_over": list(summary.passed_over),
        "devices": list(request.devices) or None,
    }


# ------------------------------------------------------------------------------------ many devices


def _run_on_devices(request: SearchRequest, events: SearchEvents) -> SearchSummary:
    """One `autotune worker` per device, each pinned to its GPU, all on this study; then the summary. With --eval, the
    reference is evaluated here first, each worker evaluates finalists after its trials (one per device at a time,
    each claimed), and what is left of the front when they end (a worker died) is evaluated here."""
    started = time.monotonic()
    deadline = request.budget.deadline(started)
    checked = _check(request, events)
    _check_devices(request.devices, checked.profile.device_type)
    with checked.named_on_interrupt():
        prepared = _prepare(checked, deadline, events)  # builds the model and the reference once, for every worker here
        reference = _evaluate_reference(checked, prepared, deadline, events) if request.evaluation else None
        session = open_session(checked, prepared, events)
        if reference is not None and reference.new:
            store_task(session.study, reference.stored)
        study = session.study
        run_id = uuid.uuid4().hex[:12]
        shares = _shares(request.budget.max_trials, len(request.devices))
        workers: list[_Worker] = []
        try:
            for index, (device, share) in enumerate(zip(request.devices, shares, strict=True)):
                if share != 0:
                    workers.append(_start_worker(session, index, device, share, deadline, run_id, events))
            codes = [worker.wait() for worker in workers]
            # A worker that died left its trial RUNNING: fail it now and queue its retry, as a worker would.
            session.recovery()
            workers_ended = time.monotonic()
            finalists = evaluate_finalists(session, reference, deadline, events) if reference is not None else ()
        except Interrupted as interrupt:  # each worker records its own trial, then ends
            with deferred():
                for worker in workers:
                    worker.stop(interrupt.signum)
            raise
    elapsed = time.monotonic() - started
    launched = sum(1 for r in studies.records(study) if r.launched and r.run_id == run_id)
    failed = tuple(f"{w.label} {_ended(code)}" for w, code in zip(workers, codes, strict=True) if code)
    finished = len(workers) - len(failed)
    reason = f"{finished} of {len(workers)} workers finished" if failed else f"{len(workers)} workers finished"
    spent = {"preparing and workers": workers_ended - started}
    if reference is not None:
        spent[EVALUATING + ", after the workers"] = time.monotonic() - workers_ended
        finalists = (*finalists, front_evaluated(OpenedStudy.of(study, session.storage_url)))
    summary = SearchSummary(session.name, session.storage_url, launched, reason, elapsed, spent, failed)
    summary = replace(summary, evaluation=tuple(finalists))
    studies.record_search_run(study, _run_record(request, summary))
    return _with_best(summary, study)


def _ended(exit_code: int) -> str:
    if exit_code < 0:
        return f"was killed by {signal.Signals(-exit_code).name}"
    return f"ended with exit status {exit_code}"


def _check_devices(devices: tuple[str, ...], device_type: DeviceType) -> None:
    for device in devices:
        if device == "cpu":
            if device_type == "cuda":
                raise UserError("--devices: cpu workers cannot run trials for a GPU profile; name GPU indices")
            continue
        if not device.isdigit():
            raise UserError(f"--devices {device!r}: give GPU indices such as 0,1,2,3 (or cpu for CPU workers)")
        if device_type != "cuda" or detect_gpu(int(device)) is None:
            raise UserError(f"--devices {device}: no CUDA GPU {device} here for a {device_type} profile")


def _shares(max_trials: int | None, workers: int) -> list[int | None]:
    """Split a number of trials between workers (None: no limit for any)."""
    if max_trials is None:
        return [None] * workers
    return [max_trials // workers + (1 if index < max_trials % workers else 0) for index in range(workers)]


class _Worker:
    """An `autotune worker` process whose output lines are relayed, prefixed with its device."""

    def __init__(self, process: subprocess.Popen, label: str, events: SearchEvents, request: Path) -> None:
        self.process = process
        self.label = label
        self.request = request  # the file its request was handed over in, removed once it ends
        self.relay = threading.Thread(target=self._relay, args=(label, events), daemon=True)
        self.relay.start()

    def _relay(self, label: str, events: SearchEvents) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            events.note(f"[{label}] {line.rstrip()}")

    def wait(self) -> int:
        code = self.process.wait()
        self.relay.join(timeout=5)
        self.request.unlink(missing_ok=True)
        return code

    def stop(self, signum: int) -> None:
        """Pass the signal on (SIGTERM reaches this process only) and let the worker record its trial."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)
        try:
            self.process.wait(timeout=WORKER_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.relay.join(timeout=5)
        self.request.unlink(missing_ok=True)


WORKER_STOP_GRACE_S = 30.0


def _start_worker(
    session: Session,
    index: int,
    device: str,
    share: int | None,
    deadline: float | None,
    run_id: str,
    events: SearchEvents,
) -> _Worker:
    request = session.request
    env = child_environment(dict(os.environ))  # the worker dies with this process
    if device != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = device  # pinned: the worker sees its GPU only, as cuda:0
    budget_s = None if deadline is None else max(1.0, deadline - time.monotonic())
    worker = WorkerRequest(
        replace(request.storage, study_name=session.name, url=session.storage_url),
        "cpu" if device == "cpu" else "cuda:0",
        BudgetSpec(budget_s, share, request.budget.trial_timeout_s),
        request.model.trust_remote_code,
        run_id,
    )
    handle, name = tempfile.mkstemp(prefix=f"worker-{index}-", suffix=".json", dir=session.workdir)  # owner-only
    with os.fdopen(handle, "w") as written:  # the storage URL may carry a password
        json.dump(worker.to_json(), written)
    command = [sys.executable, "-m", "autotune", "join", name]
    label = f"worker {index}, {'cpu' if device == 'cpu' else f'gpu {device}'}"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return _Worker(process, label, events, Path(name))
