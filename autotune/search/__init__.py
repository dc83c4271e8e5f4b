"""The search: prepare the model and its reference, then ask Optuna for configurations and measure them.

request -> inputs checked -> prepare (model, reference) -> session (the study created or joined) ->
loop (what runs next, the budget) over trials (ask, claim, run the worker, store, retry) -> run (in this process, as a
worker, or one per device).

Nothing is imported here, so that `autotune.search.interrupts` (which the CLI installs at once) loads
without optuna and sqlalchemy: import from the modules themselves (autotune.search.run, ...).
"""
