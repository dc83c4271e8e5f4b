"""What only the tests (and the benchmarks) use, in one package the product never imports: the product reaches it
through one switch, autotune/for_tests.py, whose one-line calls do nothing unless a test set AUTOTUNE_INJECT_FAULTS or
AUTOTUNE_HOLD_AT, or wrote a fault into a task spec (docs/ci.md, "Test hooks").

faults.py         which trials of a search fail for real, where and how (the study process)
worker_faults.py  how the trial worker fails: at a phase, at a probe's batch, planted in the model, as the load starts
moments.py        a process held at a named moment of its life, so a test stops the database exactly then
replay.py         the replay harness: search strategies replayed against a measured grid, no model running
"""
