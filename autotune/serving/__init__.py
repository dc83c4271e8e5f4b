"""Serving under load: the `serve` workload's load spec, its load generator and its figures (no torch)."""
