"""Claims: which trial measures which configuration, kept in the study's own database; which process runs a trial.

A claim is a row with a unique key (study, configuration), so when several search processes or
workers sample the same configuration at once, the database lets exactly one of them insert it: a
configuration is never measured twice, on SQLite as on PostgreSQL, on one machine or many. The study
is identified by Optuna's study id, so a study deleted and created again under its name starts clean.

A trial also records its owner, the process that runs it (host, pid, process start time): recovery
(study/recovery.py) fails the trials whose owner is gone.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import optuna
import psutil
import sqlalchemy
from sqlalchemy.exc import IntegrityError

from autotune.study.patience import Patience, storage_problem
from autotune.study.records import TrialRecord

Result = TypeVar("Result")

_METADATA = sqlalchemy.MetaData()
CLAIMS = sqlalchemy.Table(
    "autotune_claims",
    _METADATA,
    sqlalchemy.Column("study_id", sqlalchemy.Integer, primary_key=True),
    sqlalchemy.Column("config_hash", sqlalchemy.String(64), primary_key=True),
    sqlalchemy.Column("trial_number", sqlalchemy.Integer, nullable=False),
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
    """Whether the process that runs a trial on this host still runs (pids are reused: check start time)."""
    try:
        return abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) < 1.0
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
