"""The search: prepare the model and its reference, then ask Optuna for configurations and measure them.

request -> session (the study, checked and created or joined) -> prepare (model, reference) ->
loop (ask, claim, run the worker, tell) -> run (in this process, as a worker, or one per device).

Nothing is imported here, so that `autotune.search.interrupts` (which the CLI installs at once) loads
without optuna and sqlalchemy: import from the modules themselves (autotune.search.run, ...).
"""
