"""Claims: which trial measures which configuration, kept in the study's own database; which process runs a trial.

A claim is a row with a unique key (study, configuration), so when several search processes or
workers sample the same configuration at once, the database lets exactly one of them insert it: a
configuration is never measured twice, on SQLite as on PostgreSQL, on one machine or many. The study
is identified by Optuna's study id, so a study deleted and created again under its name starts clean.

A trial also records its owner, the process that runs it (host, pid, process start time): recovery
(study/recovery.py) fails the trials whose owner is gone.

A finalist's evaluation on the study's task (tier 1) is claimed the same way, in a table of its own (Evaluations): a
row per evaluated trial, inserted by exactly one process, which records its owner and a heartbeat in the database's
own clock while it evaluates. Recovery gives back the evaluations whose process died (its host sees it gone) or whose
heartbeat went stale (the other hosts, after the trials' grace period); the next process free takes it, once.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import optuna
import psutil
import sqlalchemy
from sqlalchemy.exc import IntegrityError

from autotune.study.patience import Patience, storage_problem
from autotune.study.records import MAX_INTERRUPTIONS, TrialRecord

Result = TypeVar("Result")

_METADATA = sqlalchemy.MetaData()
CLAIMS = sqlalchemy.Table(
    "autotune_claims",
    _METADATA,
    sqlalchemy.Column("study_id", sqlalchemy.Integer, primary_key=True),
    sqlalchemy.Column("config_hash", sqlalchemy.String(64), primary_key=True),
    sqlalchemy.Column("trial_number", sqlalchemy.Integer, nullable=False),
)
EVALUATIONS = sqlalchemy.Table(
    "autotune_evaluations",
    _METADATA,
    sqlalchemy.Column("study_id", sqlalchemy.Integer, primary_key=True),
    sqlalchemy.Column("trial_number", sqlalchemy.Integer, primary_key=True),
    sqlalchemy.Column("state", sqlalchemy.String(16), nullable=False),
    sqlalchemy.Column("token", sqlalchemy.Integer, nullable=False),  # the claiming process's own
    sqlalchemy.Column("owner", sqlalchemy.Text, nullable=False),  # this_process() as JSON
    sqlalchemy.Column("attempts", sqlalchemy.Integer, nullable=False),  # processes that took it
    sqlalchemy.Column("heartbeat", sqlalchemy.DateTime, nullable=False),  # the database's clock
)


def _hash(config_key: str) -> str:
    return hashlib.sha256(config_key.encode()).hexdigest()


class Claims:
    """The claims of one study. With a Patience (the storage's), each statement is retried through an outage: an
    insert whose commit landed before its connection dropped fails again as taken, by this very trial."""

    def __init__(self, engine: sqlalchemy.engine.Engine, study_id: int, patience: Patience | None = None) -> None:
        self.engine = engine
        self.study_id = study_id
        self.patience = patience
        self._patiently(self._create_table)

    def _create_table(self) -> None:
        try:
            _METADATA.create_all(self.engine, checkfirst=True)
        except sqlalchemy.exc.DatabaseError as error:
            if storage_problem(error) is not None:  # locked, unreachable, full: the patience waits it out
                raise
            _METADATA.create_all(self.engine, checkfirst=True)  # another process created it between check and create

    def _patiently(self, statement: Callable[[], Result]) -> Result:
        return statement() if self.patience is None else self.patience.call(statement)

    def claim(self, config_key: str, trial_number: int) -> int:
        """Claim a configuration for a trial; returns the trial that holds it (this one if the claim won)."""
        try:
            self._patiently(lambda: self._insert(config_key, trial_number))
            return trial_number
        except IntegrityError:
            holder = self.holder(config_key)
            return holder if holder is not None else self.claim(config_key, trial_number)

    def _insert(self, config_key: str, trial_number: int) -> None:
        with self.engine.begin() as connection:
            row = {"study_id": self.study_id, "config_hash": _hash(config_key), "trial_number": trial_number}
            connection.execute(CLAIMS.insert().values(**row))

    def take_trial(self, trial_id: int, token: int) -> bool:
        """Whether the process holding `token` is the one that popped this queued trial. Optuna pops a
        WAITING trial by reading it, then setting it RUNNING; on SQLite the read happens outside the write
        transaction, so two workers can pop the same trial. The first to insert the row keeps it."""
        return self.claim(f"asked trial id {trial_id}", token) == token

    def holder(self, config_key: str) -> int | None:
        return self._patiently(lambda: self._holder(config_key))

    def _holder(self, config_key: str) -> int | None:
        with self.engine.connect() as connection:
            return connection.execute(
                sqlalchemy.select(CLAIMS.c.trial_number).where(
                    CLAIMS.c.study_id == self.study_id, CLAIMS.c.config_hash == _hash(config_key)
                )
            ).scalar()

    def release(self, config_key: str, trial_number: int) -> None:
        """Give a configuration back (its trial was interrupted or stopped by the budget, never measured)."""
        self._patiently(lambda: self._delete(config_key, trial_number))

    def _delete(self, config_key: str, trial_number: int) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                CLAIMS.delete().where(
                    CLAIMS.c.study_id == self.study_id,
                    CLAIMS.c.config_hash == _hash(config_key),
                    CLAIMS.c.trial_number == trial_number,
                )
            )


OWNER_ATTR = "owner"  # the process that took the trial (this_process)
WORKER_PID_ATTR = "worker_pid"  # the trial worker it launched


def this_process() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process that runs a trial on this host still runs (pids are reused: check start time). A process
    killed but not yet reaped by its parent (a zombie: `search --devices` waits for its workers in turn) runs no
    more."""
    try:
        process = psutil.Process(owner["pid"])
        return abs(process.create_time() - owner["started"]) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError):
        return False


def claim_configuration(study: optuna.Study, claims: Claims, config_key: str, number: int) -> int:
    """Claim a configuration for trial `number`; the trial that holds it. An interrupted trial's claim is taken
    over: recovery queues the retry before it releases the claim, and a retry asked in between must still run."""
    holder = claims.claim(config_key, number)
    if holder != number and TrialRecord.from_frozen(study.get_trials(deepcopy=False)[holder]).interrupted:
        claims.release(config_key, holder)
        holder = claims.claim(config_key, number)
    return holder


# ------------------------------------------------------------------------------------ evaluations

RUNNING, DONE, FAILED, INTERRUPTED = "running", "done", "failed", "interrupted"


@dataclass(frozen=True)
class EvaluationClaim:
    """Who evaluates (or evaluated) a trial on the study's task, and how that went."""

    number: int
    state: str  # RUNNING, DONE, FAILED (the evaluation itself failed), INTERRUPTED (its process died or was stopped)
    owner: dict[str, Any]
    attempts: int

    @property
    def given_up(self) -> bool:
        """Interrupted after its one retry: not taken again by a search or a worker."""
        return self.state == INTERRUPTED and self.attempts > MAX_INTERRUPTIONS

    @property
    def free(self) -> bool:
        """Whether the next process may take it: its evaluation was interrupted, and not twice."""
        return self.state == INTERRUPTED and not self.given_up


class Evaluations:
    """The claims on the study's finalists' evaluations (tier 1): exactly one process evaluates a trial at a time, and a
    trial whose process died is taken by the next, once. Each statement goes through the claims' patience."""

    def __init__(self, claims: Claims) -> None:
        self.engine, self.study_id, self.patience = claims.engine, claims.study_id, claims.patience

    def _patiently(self, statement: Callable[[], Result]) -> Result:
        return statement() if self.patience is None else self.patience.call(statement)

    def _row(self, number: int) -> Any:
        return sqlalchemy.and_(EVALUATIONS.c.study_id == self.study_id, EVALUATIONS.c.trial_number == number)

    def _running(self, number: int, token: int) -> Any:
        """The row of trial `number` while the process holding `token` evaluates it."""
        return sqlalchemy.and_(self._row(number), EVALUATIONS.c.token == token, EVALUATIONS.c.state == RUNNING)

    def take(self, number: int, token: int, again: bool = False) -> bool:
        """Claim the evaluation of trial `number` for the process holding `token`: a new one, or one whose process was
        interrupted (once; `again`: whatever ended it, interrupted or failed, as `autotune evaluate --trial` asks)."""
        try:
            self._patiently(lambda: self._insert(number, token))
            return True
        except IntegrityError:
            return self._patiently(lambda: self._take_over(number, token, again))

    def _insert(self, number: int, token: int) -> None:
        with self.engine.begin() as connection:
            row = {"study_id": self.study_id, "trial_number": number, "state": RUNNING, "token": token, "attempts": 1}
            connection.execute(EVALUATIONS.insert().values(**row, **self._owned()))

    def _take_over(self, number: int, token: int, again: bool) -> bool:
        ended = [INTERRUPTED, FAILED] if again else [INTERRUPTED]
        retry = EVALUATIONS.c.attempts <= MAX_INTERRUPTIONS
        condition = sqlalchemy.and_(self._row(number), EVALUATIONS.c.state.in_(ended))
        if not again:
            condition = sqlalchemy.and_(condition, retry)
        values = {"state": RUNNING, "token": token, "attempts": EVALUATIONS.c.attempts + 1, **self._owned()}
        with self.engine.begin() as connection:
            return connection.execute(EVALUATIONS.update().where(condition).values(**values)).rowcount == 1

    @staticmethod
    def _owned() -> dict[str, Any]:
        return {"owner": json.dumps(this_process()), "heartbeat": sqlalchemy.func.now()}

    def beat(self, number: int, token: int) -> None:
        """One heartbeat of an evaluation this process runs (not retried: its heartbeat thread tries again)."""
        mine = self._running(number, token)
        with self.engine.begin() as connection:
            connection.execute(EVALUATIONS.update().where(mine).values(heartbeat=sqlalchemy.func.now()))

    def end(self, number: int, token: int, state: str) -> bool:
        """The evaluation this process ran ended (DONE, FAILED, INTERRUPTED); False when it was no longer this
        process's (recovery gave it to another meanwhile)."""
        mine = self._running(number, token)

        def update() -> bool:
            with self.engine.begin() as connection:
                return connection.execute(EVALUATIONS.update().where(mine).values(state=state)).rowcount == 1

        return self._patiently(update)

    def holds(self, number: int, token: int) -> bool:
        """Whether this process still holds the evaluation it runs."""
        mine = self._running(number, token)

        def read() -> bool:
            with self.engine.connect() as connection:
                return connection.execute(sqlalchemy.select(EVALUATIONS.c.trial_number).where(mine)).first() is not None

        return self._patiently(read)

    def give_back(self, number: int, token: int) -> None:
        """Forget a claim whose evaluation never ran to an end of its own (the budget stopped it): free for a later
        run, no attempt counted."""
        mine = self._running(number, token)

        def delete() -> None:
            with self.engine.begin() as connection:
                connection.execute(EVALUATIONS.delete().where(mine))

        self._patiently(delete)

    def claims(self) -> dict[int, EvaluationClaim]:
        """Every evaluation claimed in the study, by trial number."""
        return {claim.number: claim for claim, _, _ in self._patiently(self._read)}

    def _read(self) -> list[tuple[EvaluationClaim, int, datetime]]:
        """Each row: its claim, its token and its last heartbeat."""
        columns = (EVALUATIONS.c.trial_number, EVALUATIONS.c.state, EVALUATIONS.c.owner, EVALUATIONS.c.attempts,
                   EVALUATIONS.c.token, EVALUATIONS.c.heartbeat)  # fmt: skip
        with self.engine.connect() as connection:
            rows = connection.execute(sqlalchemy.select(*columns).where(EVALUATIONS.c.study_id == self.study_id))
            return [(EvaluationClaim(number, state, json.loads(owner), attempts), token, beat) for number, state,
                    owner, attempts, token, beat in rows]  # fmt: skip

    def recover(self, grace_s: float) -> list[int]:
        """Mark interrupted the evaluations whose process died: on this host, a process gone; on any, a heartbeat older
        than `grace_s` by the database's clock. Their numbers (each now free for the next process, once)."""
        return self._patiently(lambda: self._recover(grace_s))

    def _recover(self, grace_s: float) -> list[int]:
        host = socket.gethostname()
        with self.engine.begin() as connection:
            now = _naive(connection.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar())
        dead = [
            (claim.number, token)
            for claim, token, beat in self._read()
            if claim.state == RUNNING
            and (
                (claim.owner.get("host") == host and not owner_alive(claim.owner))
                or now - _naive(beat) > timedelta(seconds=grace_s)
            )
        ]
        recovered = []
        for number, token in dead:  # each as it was read: one taken again meanwhile runs on
            with self.engine.begin() as connection:
                ended = EVALUATIONS.update().where(self._running(number, token)).values(state=INTERRUPTED)
                if connection.execute(ended).rowcount:
                    recovered.append(number)
        return recovered


def _naive(moment: datetime) -> datetime:
    """A timestamp of the database without its zone, as Optuna compares its heartbeats (PostgreSQL's now() has one,
    the column none: both are the server's local time)."""
    return moment.replace(tzinfo=None)
