"""The trial process: the only code that imports torch. Tasks, loading, the workload, failures, measurement."""
