"""What a trial measures, inside the worker: timed iterations, speed figures, memory, energy and quality."""
