"""The search's strategy: what runs before the sampler takes over (queue.py), in which order (ranking.py), from what
each configuration is expected to measure (forecast.py) and how long its trial will take (durations.py), with a
configuration as changes from the baseline (changes.py). Used by the search's loop and its dry run (its replay harness,
which replays strategies against a measured grid, is the tests': autotune/testing/replay.py); re-exports nothing, so
that importing it loads no study library."""
