"""After the trials: objectives and figures, the Pareto front, constraints, picking one configuration,
comparing studies."""
