"""The trial process: with the fork server, the only code that imports torch. Tasks, loading, generation, failures."""
