"""Process isolation: the parent runs each task in a worker process (runner), forked by a fork server (forkserver),
and both sides speak one contract (results) and one list of phases (phases). Nothing here imports torch but the fork
server itself, which runs in its own process."""
