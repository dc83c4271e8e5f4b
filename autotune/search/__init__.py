"""The search: prepare the model and its reference, then ask Optuna for configurations and measure them.

request -> session (the study, checked and created or joined) -> prepare (model, reference) ->
loop (ask, claim, run the worker, tell) -> run (in this process, as a worker, or one per device).
"""

from autotune.search.loop import expected_duration_s, overrun_reason
from autotune.search.options import SearchError, SearchEvents, SearchSummary
from autotune.search.prepare import Prepared, baseline_config, plan_target, prepare, trial_spec
from autotune.search.run import join_study, run_search
from autotune.specs import BudgetSpec, HardwareSpec, SearchRequest, StorageSpec, WorkerRequest

__all__ = [
    "BudgetSpec",
    "HardwareSpec",
    "Prepared",
    "SearchError",
    "SearchEvents",
    "SearchRequest",
    "SearchSummary",
    "StorageSpec",
    "WorkerRequest",
    "baseline_config",
    "expected_duration_s",
    "join_study",
    "overrun_reason",
    "plan_target",
    "prepare",
    "run_search",
    "trial_spec",
]
