"""The figures a trial reports and how a study judges them: metrics (name, unit, direction), objectives, constraints,
and summaries of repeated measurements.

Below storage (study/) and analysis, which both read them, and light to import: no optuna, no torch.
"""
