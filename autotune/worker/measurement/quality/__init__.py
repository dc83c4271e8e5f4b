"""Quality against the reference configuration, measured on the path the trial's speed came from.

forced.py: teacher-forced decoding through the generate() call the trial timed, as llama.cpp's `perplexity
--kl-divergence` (KL, top-1 agreement, perplexity), and token agreement along the reference's greedy continuations;
reference.py: what the reference computes through its own decoding path, and its files; outputs.py: greedy agreement
and the checks of a trial's timed outputs (broken); degenerate.py: tier 0, the share of its free-running generations
that are degenerate; prefill.py: the prefill path studies before 2026-11-27 stored, kept to show what it missed.
"""
