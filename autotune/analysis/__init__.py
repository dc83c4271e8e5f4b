"""After the trials: the Pareto front, picking one configuration, comparing studies (the figures they judge by
are autotune.figures)."""
