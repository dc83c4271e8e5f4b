"""The search's strategy: what runs before the sampler takes over (queue.py), in which order (ranking.py), from what
each configuration is expected to measure (forecast.py) and how long its trial will take (durations.py), with a
configuration as changes from the baseline (changes.py); and its replay harness (replay.py), which replays strategies
against a measured grid. Used by the search's loop and its dry run; re-exports nothing, so that importing it loads no
study library."""
