"""A fork server: import torch and transformers once, then fork one fresh process per task.

Every trial still runs in its own process, with its own memory, its own process group and its own
fate, but it no longer pays the seconds of importing the libraries (docs/measurement.md gives the
split). It serves tasks on a CPU only: a task on a GPU is spawned (autotune.process.fork_client.forkable:
on an H100 forked trials could not use CUDA). It never starts a thread before forking; if it finds another thread,
or CUDA initialised by an import, it refuses and the runner spawns.

Protocol (JSON lines): the runner writes {"spec", "result", "log", "env"}; the server answers
{"pid": N} once the child runs, then {"pid": N, "status": wait status} when it has ended. The server ends when the
runner closes its end of the pipe, killing a task that still runs: nobody is left to wait for it.

A fork template (`python -m autotune.worker.forkserver --template SOCKET`, named to autotune commands by
AUTOTUNE_FORK_TEMPLATE) imports once for many commands: each command's fork server is forked from it, ready at once,
instead of importing anew. It serves only a command whose environment agrees with its own wherever the libraries
read it when imported (IMPORT_TIME_VARIABLES), run by the same Python on the same autotune.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import autotune
from autotune.process.life import die_with_parent, worker_environment

# Variables the imported libraries (and Python itself) read once, when imported: a server forked from a template keeps
# the template's values of these, so it serves a command only where they agree.
IMPORT_TIME_VARIABLES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOTO_", "TORCH", "PYTORCH_",
                         "CUDA_", "NVIDIA_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "BNB_", "XDG_",
                         "HOME")  # fmt: skip
MAX_REQUEST_BYTES = 1 << 20


def _preload() -> None:
    """Import what every trial imports, without running anything (no CUDA, no torch thread pool; the OpenBLAS pools
    numpy and scipy start when loaded shut down at a fork and start again in the child)."""
    import torch
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.integrations import hub_kernels  # noqa: F401 - the slowest lazy import

    import autotune.worker.tasks  # noqa: F401

    if not torch.backends.cuda.is_built():
        # What a trial imports before its memory baseline (0.6 s of every trial's load on 2 cores), torchao and scipy
        # among them: only where torch has no CUDA is it sure that importing them initialises no GPU.
        from autotune.worker.loading import import_first_call_modules

        import_first_call_modules()


def _import_frozen() -> None:
    # Importing torch and transformers makes millions of objects that live as long as the process: collecting them as
    # they come took 1 s of the 7.8 s of CPU the preload took. Frozen, the children's collections never scan them.
    gc.disable()
    _preload()
    gc.freeze()
    gc.enable()


def _end_after(who: str, body: Callable[[], None]) -> NoReturn:
    """In a forked process: run `body`, then end here whatever happens (status 0 only if it returned)."""
    code = 1
    try:
        body()
        code = 0
    except BaseException as error:
        print(f"{who}: {type(error).__name__}: {error}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _child(request: dict, born: float) -> NoReturn:
    """In the forked process: become a session leader, log to the trial's file, run the task, exit."""
    _end_after("autotune worker", lambda: _run_task(request, born))


def _run_task(request: dict, born: float) -> None:
    from autotune.worker.__main__ import run

    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(request.get("env", {}))
    die_with_parent(expected_parent=int(request["server"]))
    run(Path(request["spec"]), Path(request["result"]), born)


def unsafe_to_fork() -> str | None:
    """Why a fork now would hand the child a broken process, or None."""
    import torch

    if threading.active_count() != 1:
        return "the fork server has started a thread; it cannot fork safely"
    if torch.cuda.is_initialized():
        return "CUDA was initialised in the fork server (by an import); a forked process cannot use it"
    return None


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Requests:
    """The lines the runner writes on standard input, read without a buffer select() cannot see."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.pending = b""
        self.ended = False

    def next(self) -> bytes | None:
        """The next whole line, or None once the runner closed its end."""
        while b"\n" not in self.pending and not self.ended:
            self.read()
        if b"\n" not in self.pending:
            return None
        line, self.pending = self.pending.split(b"\n", 1)
        return line

    def read(self) -> None:
        chunk = os.read(self.fd, 65536)
        self.pending += chunk
        self.ended = not chunk


def _serve(requests: Requests) -> None:
    """Fork a child per request and report it, until the runner closes the pipe."""
    while (line := requests.next()) is not None:
        request = {**json.loads(line), "server": os.getpid()}
        refusal = unsafe_to_fork()
        if refusal is not None:
            _send({"refused": refusal})
            continue
        born = time.time()
        pid = os.fork()
        if pid == 0:
            _child(request, born)
        _send({"pid": pid})
        status = _wait_for(pid, requests)
        if status is None:
            return
        _send({"pid": pid, "status": status})


def _wait_for(pid: int, requests: Requests) -> int | None:
    """The child's wait status; None if the runner closed the pipe first (the child's group is then killed)."""
    try:
        child = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: the runner kills the server itself when it goes
        return os.waitpid(pid, 0)[1]
    try:
        while not requests.ended:
            ready, _, _ = select.select([child, requests.fd], [], [])
            if child in ready:
                return os.waitpid(pid, 0)[1]
            requests.read()
    finally:
        os.close(child)
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def import_time_difference(theirs: dict[str, str], ours: dict[str, str]) -> str | None:
    """The first variable read at import time whose value differs between two environments, or None."""
    names = {name for name in theirs.keys() | ours.keys() if name.startswith(IMPORT_TIME_VARIABLES)}
    return next((name for name in sorted(names) if theirs.get(name) != ours.get(name)), None)


def _refusal(request: dict, given: dict[str, str]) -> str | None:
    """Why the template, started in the environment `given`, cannot hand this command a server forked from itself."""
    if request.get("executable") != sys.executable:
        return f"the command runs {request.get('executable')}, the template {sys.executable}"
    if request.get("package") != str(Path(autotune.__file__).parent):
        return f"the command imports autotune from {request.get('package')}, the template from another place"
    differing = import_time_difference(request.get("env", {}), given)
    if differing is not None:
        return f"{differing} differs from the template's (read when the libraries are imported)"
    return unsafe_to_fork()


def main() -> None:
    die_with_parent()
    _import_frozen()
    _send({"ready": True, "pid": os.getpid()})
    _serve(Requests())


def template(address: str) -> None:
    """Import once, then fork a ready fork server for each command that connects to `address` (fork_client.py)."""
    die_with_parent()
    os.environ.update(worker_environment(dict(os.environ)))  # what a command's fork server runs in (fork_client.py)
    listener = _listen(address)
    given = dict(os.environ)
    _import_frozen()
    imported = {name: value for name, value in os.environ.items() if given.get(name) != value}  # set by an import
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the servers it forks are reaped as they end
    _send({"ready": True, "pid": os.getpid()})
    while True:
        connection, _ = listener.accept()
        with connection:
            _hand_out(listener, connection, given, imported)


def _listen(address: str) -> socket.socket:
    """A socket listening at `address`; a file a dead template left there is replaced, a live template's is not."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
        try:
            probe.connect(address)
        except OSError:
            pass
        else:
            _refuse(f"another template listens on {address}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with contextlib.suppress(FileNotFoundError):
            if Path(address).is_socket():
                Path(address).unlink()
        listener.bind(address)
    except OSError as error:
        _refuse(f"cannot listen on {address}: {error.strerror}")
    listener.listen(64)  # a command connecting while the imports run waits for them, as for a server of its own
    return listener


def _refuse(reason: str) -> NoReturn:
    print(f"autotune fork template: {reason}", file=sys.stderr)
    raise SystemExit(2)


def _hand_out(
    listener: socket.socket, connection: socket.socket, given: dict[str, str], imported: dict[str, str]
) -> None:
    """Fork a fork server on the two pipe ends the command sent (its standard input and output), or say why not."""
    try:
        message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST_BYTES, 2)
    except OSError:
        return
    if not message:  # a probe (a template starting at the same address), not a command
        for fd in fds:
            os.close(fd)
        return
    try:
        request = json.loads(message)
        refusal = _refusal(request, given) if len(fds) == 2 else "the command sent no pipes"
        if refusal is not None:
            print(
                f"fork template: no server for a command in {request.get('cwd')}: {refusal}",
                file=sys.stderr,
                flush=True,
            )
            connection.send(json.dumps({"refused": refusal}).encode())
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_server(request, imported, fds, [listener, connection])
        print(f"fork template: server {pid} for a command in {request.get('cwd')}", file=sys.stderr, flush=True)
        connection.send(json.dumps({"pid": pid}).encode())
    except (OSError, ValueError):
        return
    finally:
        for fd in fds:
            os.close(fd)


def _become_server(request: dict, imported: dict[str, str], fds: list[int], sockets: list[socket.socket]) -> NoReturn:
    """In the forked process: the command's fork server, with its environment, folder and pipes."""
    _end_after("autotune fork server", lambda: _serve_command(request, imported, fds, sockets))


def _serve_command(request: dict, imported: dict[str, str], fds: list[int], sockets: list[socket.socket]) -> None:
    for each in sockets:
        each.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    for fd in fds:
        os.close(fd)  # only 0 and 1 stay: a task forked later must not hold the command's pipes
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**request["env"], **imported})
    _send({"ready": True, "pid": os.getpid()})
    _serve(Requests())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m autotune.worker.forkserver")
    parser.add_argument("--template", metavar="SOCKET", help="serve fork servers on this Unix socket")
    arguments = parser.parse_args()
    if arguments.template:
        template(arguments.template)
    else:
        main()
