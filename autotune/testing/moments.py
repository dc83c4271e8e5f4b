"""Tests: a process held at a named moment of its life, so that a test can stop the study's database exactly then.

AUTOTUNE_HOLD_AT='{"ask": "/tmp/t/ask", "front": "/tmp/t/front"}' holds this process the first time it reaches each
moment named: it creates /tmp/t/ask.reached, waits until /tmp/t/ask.release exists (HOLD_S at most), and goes on
to the storage call that follows. Where the variable is unset, as always outside the tests, nothing is held.

The moments, each just before the storage calls it names (tests/e2e/test_storage_e2e.py stops PostgreSQL at each),
where the product calls autotune/for_tests.py's `hold`:

open      opening the storage, its first connection made (study/storage.py)
study     creating or joining the study (search/session.py)
ask       asking Optuna for a trial (search/trial.py)
claim     claiming the trial's configuration (search/trial.py)
front     recording the search's run, then reading its front (search/run.py)
read      reading a stored study once loaded: the report of a search, `best`, `report`, `history` (study/opened.py)
report    storing the report with the study (search/finish.py)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import sqlalchemy

from autotune.for_tests import HOLD_VARIABLE

MOMENTS = ("open", "study", "ask", "claim", "front", "read", "report")
HOLD_S = 300.0

_held: set[str] = set()  # the moments this process was held at already: each is held once


def _stem(moment: str) -> str | None:
    """Where this process says it reached `moment` and learns it may go on; None when it is not to be held there."""
    if moment in _held:
        return None
    named = os.environ.get(HOLD_VARIABLE)
    return json.loads(named).get(moment) if named else None


def reach(moment: str) -> None:
    """Hold here if a test asked to (see the module's docstring)."""
    assert moment in MOMENTS, moment
    stem = _stem(moment)
    if stem is None:
        return
    _held.add(moment)
    Path(f"{stem}.reached").touch()
    deadline = time.monotonic() + HOLD_S
    while not Path(f"{stem}.release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def reach_once_connected(moment: str) -> None:
    """Hold at `moment` once the next connection to a database is made (before any statement runs on it), if a test
    asked to."""
    if _stem(moment) is not None:
        sqlalchemy.event.listen(sqlalchemy.pool.Pool, "connect", lambda *_: reach(moment), once=True)
