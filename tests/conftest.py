"""Shared fixtures. GPU tests carry the `gpu` marker and are skipped where torch sees no CUDA device."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import optuna
import psutil
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.process import phases
from autotune.process.life import TEMPLATE_VARIABLE, child_environment
from autotune.study import TrialRecord, open_storage, records

REPO = Path(__file__).resolve().parents[1]
DEMO_BUILD = """
from autotune.paths import default_cache_dir
from autotune.worker.demo_model import ensure_demo_draft
from autotune.worker.extensions import build_library_extensions
ensure_demo_draft(default_cache_dir())
try:
    import optimum.quanto  # noqa: F401 - its C++ extension is compiled here, not in the first quanto trial's timeout
except ImportError:
    pass
build_library_extensions("cpu")
"""  # in a process of its own: this one does not import torch


# The build above under a lock in the cache folder, once: a second builder waits, then finds it built.
LOCKED_BUILD = f"""
import fcntl, sys
from pathlib import Path
cache = Path(sys.argv[1])
with (cache / ".demo-build.lock").open("w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (cache / ".built").exists():
        exec({DEMO_BUILD!r})
        (cache / ".built").touch()
"""
BUILDING_BESIDE = "AUTOTUNE_TEST_CACHE_BUILDING"  # set for the test processes while the build runs beside them
_background_build: subprocess.Popen | None = None


def _cuda_available() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _build_command(cache: Path) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-c", LOCKED_BUILD, str(cache)], {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache)}


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist with AUTOTUNE_TEST_CACHE_DIR (make test), the controller starts the demo model's build at
    once, in a process beside the test processes, which run the modules that do not need it first (below): neither
    waits for a build that the first test needing the cache would otherwise start (minutes on a fresh clone)."""
    global _background_build
    configured = os.environ.get("AUTOTUNE_TEST_CACHE_DIR")
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    config.option.loadscopereorder = False  # modules in the collected order (below), not by their number of tests
    if not configured:
        return
    cache = Path(configured).resolve()
    if (cache / ".built").exists():
        return
    cache.mkdir(parents=True, exist_ok=True)
    command, env = _build_command(cache)
    with (cache / ".demo-build.log").open("w") as log:
        _background_build = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)  # fmt: skip
    os.environ[BUILDING_BESIDE] = "1"  # the test processes, started after this hook, inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    """A build still running when the tests are done (none needed it) is stopped: each of its steps is kept only when
    it is complete, so the next run goes on from there. SIGINT first, so that it removes its unfinished files."""
    if _background_build is None or _background_build.poll() is not None:
        return
    os.killpg(_background_build.pid, signal.SIGINT)
    try:
        _background_build.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(_background_build.pid, signal.SIGKILL)
        _background_build.wait()


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the two test processes take modules in: those that wait for the demo model's build last while it runs
    beside them, and modules with slow tests first, so that the run ends on short modules in both processes (ordered
    by their number of tests, a one-test module of minutes ran last while the other process had nothing left)."""
    building = os.environ.get(BUILDING_BESIDE)
    waiting = {_module(item) for item in items if building and "cache_dir" in item.fixturenames}
    slow = {_module(item) for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: (_module(item) in waiting, _module(item) not in slow))  # stable: file order kept
    if not any("gpu" in item.keywords for item in items) or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def import_time_settings_kept() -> Iterator[None]:
    """What a test's own code set in this process's environment among the settings libraries read when imported,
    undone after it: importing scikit-learn (lm-eval's) sets KMP_DUPLICATE_LIB_OK, a compiling generate() sets
    TOKENIZERS_PARALLELISM. The fork template compares them with its own: every command a later test of this process
    started ran a fork server of its own (two fork template tests failed on it)."""
    from autotune.worker.forkserver import IMPORT_TIME_VARIABLES

    before = {name: value for name, value in os.environ.items() if name.startswith(IMPORT_TIME_VARIABLES)}
    yield
    for name in [name for name in os.environ if name.startswith(IMPORT_TIME_VARIABLES) and name not in before]:
        del os.environ[name]
    os.environ.update(before)


@pytest.fixture(scope="session", autouse=True)
def fork_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fork template per test process (autotune.worker.forkserver): each autotune command a test starts forks its
    fork server from it, ready at once, instead of importing torch and transformers anew (about 5 s of CPU, a hundred
    times a run). It runs in the environment cli_env gives; a command in another (or without AUTOTUNE_FORK_TEMPLATE)
    starts a server of its own, as a user's command does. Its log: fork-template.log in the process's basetemp."""
    if os.environ.get(TEMPLATE_VARIABLE):  # one the developer runs
        yield os.environ[TEMPLATE_VARIABLE]
        return
    folder = Path(tempfile.mkdtemp(prefix="autotune-fork-"))  # short: a socket's path has at most 107 bytes
    address = str(folder / "template")
    command = [sys.executable, "-m", "autotune.worker.forkserver", "--template", address]
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = str(REPO)  # what cli_env gives the commands, here for every process the tests start
    with (tmp_path_factory.getbasetemp() / "fork-template.log").open("w") as log:
        template = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=child_environment(dict(os.environ)), start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not Path(address).exists() and template.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # it listens before it imports: a command that connects then waits for the imports
    os.environ[TEMPLATE_VARIABLE] = address
    try:
        yield address
    finally:
        os.environ.clear()
        os.environ.update(saved)
        template.kill()
        template.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One autotune cache per test session, or AUTOTUNE_TEST_CACHE_DIR if set, with the demo model and its draft
    built in it (and optimum-quanto's C++ extension, where installed): a test that runs a trial with a short timeout
    must not spend it training the demo model or compiling, whichever test runs first (or alone). Where a build runs
    already (the other test process's, or the one pytest_configure started), this waits for it."""
    configured = os.environ.get("AUTOTUNE_TEST_CACHE_DIR")
    path = Path(configured).resolve() if configured else tmp_path_factory.mktemp("autotune-cache")
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".built").exists():
        command, env = _build_command(path)
        built = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
        assert built.returncode == 0, f"the demo model's build failed:\n{built.stdout}\n{built.stderr}"
    return path


@pytest.fixture
def cli_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["AUTOTUNE_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture
def bare_cli_env(tmp_path: Path) -> dict[str, str]:
    """The CLI's environment with a cache folder of its own, not yet created: for commands that never load a model
    (refused input, a dry run), which then need not wait for the demo model's build (`cache_dir`)."""
    return {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "autotune-cache"), "PYTHONPATH": str(REPO)}


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_main(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`autotune ARGS` through the CLI's own entry point (autotune.cli.main) in this process, in `cwd` with `env`:
    its real exit status, stdout and stderr, without the second or two a process of its own takes to start.

    For bad input, refused before any work: what a process of its own would add is its start-up. The process's
    environment, folder, arguments, signal handlers and logging are restored afterwards.
    """
    from autotune.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv = dict(os.environ), Path.cwd(), sys.argv
    saved_signals = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    saved_logging = (list(root.handlers), root.level)
    code: int | str | None = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["autotune", *args]
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            _log_handlers_to(stderr),
            warnings.catch_warnings(),
        ):
            warnings.showwarning = _warning_to_stderr  # on stderr, as a process of its own shows them
            try:
                main()
            except SystemExit as stop:
                code = stop.code
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
        root.handlers[:], root.level = saved_logging
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    return subprocess.CompletedProcess(["autotune", *args], returncode, stdout.getvalue(), stderr.getvalue())


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:
        pytest.skip("no Chromium installed (Debian package chromium; .ci/run installs it)")
    return path


@contextlib.contextmanager
def _log_handlers_to(stream: io.StringIO) -> Iterator[None]:
    """Plain stream handlers that libraries bound to the stderr of their import (optuna's, for one) write to
    `stream` meanwhile (pytest's own handlers are subclasses, left alone)."""
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    handlers = [handler for logger in loggers for handler in logger.handlers if type(handler) is logging.StreamHandler]
    saved = [handler.setStream(stream) for handler in handlers]
    try:
        yield
    finally:
        for handler, original in zip(handlers, saved, strict=True):
            handler.setStream(original)


def _warning_to_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


# Where what a test checks is not a speed figure's precision, its trials time their generations for a fifth of a second
# at least, not three (--min-seconds), and five calls at least as always: the same paths, a shorter timed loop.
BRIEF = ["--min-seconds", "0.2"]

# Twelve configurations whose trials each run in seconds, for the tests whose subject is not the space (workers sharing
# a study, a Slurm job): the default space sends a search into compiled, quantized and tensor-parallel trials of a
# minute or more.
CHEAP_SPACE = """
knobs:
  dtype: [float32, bfloat16, float16]
  attn_implementation: [sdpa, eager]
  execution_mode: [no_grad, inference_mode]
"""


def cheap_space(folder: Path) -> list[str]:
    """CHEAP_SPACE written in `folder` as space.yaml, and the `--space` flag that names it (relative to `folder`)."""
    (folder / "space.yaml").write_text(CHEAP_SPACE)
    return ["--space", "space.yaml"]


# ------------------------------------------------------------------ the one real search of the suite

DEMO_STUDY = "demo-cpu"
DEMO_CONSTRAINT = "memory<=40MB"  # steady on CPU: the flex-attention 4-bit trial (about 50 MB) breaks it
DEMO_FAILING_TRIAL = 7  # the last of the first run's 8 trials fails while loading
DEMO_FAULT = {"phase": "load", "kind": "raise"}
DEMO_SEARCH = [
    "search",
    "--model",
    "demo",
    "--gpu",
    "cpu",
    "--seed",
    "3",
    "--batch-size",
    "4",
    "--input-len",
    "64",
    "--output-len",
    "32",
    *BRIEF,
]
# Runs the real CLI, then tells whether the study process ever imported torch.
WRAPPER = (
    "import sys\n"
    "from autotune.cli import main\n"
    "sys.argv = ['autotune', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as stop:\n    code = stop.code\n"
    "print('TORCH_IMPORTED_BY_STUDY_PROCESS', 'torch' in sys.modules)\n"
    "sys.exit(code)\n"
)


def run_demo_search(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, *DEMO_SEARCH, *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )


@dataclass(frozen=True)
class DemoSearch:
    workdir: Path
    completed: subprocess.CompletedProcess
    records: list[TrialRecord]  # right after the first run
    env: dict[str, str]

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.workdir}/studies/{DEMO_STUDY}.db"

    @property
    def report(self) -> Path:
        return self.workdir / "reports" / f"{DEMO_STUDY}.html"

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=DEMO_STUDY, storage=self.storage)


@pytest.fixture(scope="session")
def demo_search(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> DemoSearch:
    """One real search on the demo model (8 trials under one constraint), shared by the slow tests, and by both test
    processes under pytest-xdist (`shared_once`).

    Its last trial fails for real while loading (an injected exception), so that the study, its report and the
    tests that read them always hold a failure. Tests that add trials work on a copy of its folder.
    """
    env = dict(os.environ)
    env["AUTOTUNE_CACHE_DIR"] = str(cache_dir)

    def search(workdir: Path) -> None:
        faulty = {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps({str(DEMO_FAILING_TRIAL): DEMO_FAULT})}
        done = run_demo_search(workdir, faulty, "--trials", "8", "--constraint", DEMO_CONSTRAINT)
        assert done.returncode == 0, done.stdout + done.stderr
        printed = [done.args, done.returncode, done.stdout, done.stderr]
        workdir.with_suffix(".json").write_text(json.dumps(printed))  # beside its folder, which tests copy

    workdir = shared_once(tmp_path_factory, "search", search)
    completed = subprocess.CompletedProcess(*json.loads(workdir.with_suffix(".json").read_text()))
    search_done = DemoSearch(workdir, completed, [], env)
    return DemoSearch(workdir, completed, records(search_done.study()), env)


def shared_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, which `build` fills once per test run: under pytest-xdist once for all its processes (the
    first to come builds it under a lock, the others wait, then find it done). Its users only read it, or copy it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each process's own (popen-gw0, popen-gw1)
    folder, done = root / name, root / f"{name}.done"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed in the other process
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


# Exactly eight configurations, each of which runs on a CPU: a search of eight trials measures each once, whichever
# order its strategy (which ranks by measured durations) launches them in.
EIGHT_CONFIGURATIONS = """
knobs:
  dtype: [float32, bfloat16]
  attn_implementation: [sdpa, eager]
  execution_mode: [no_grad, inference_mode]
"""


# --------------------------------------------------------------------- a search watched while it runs

Found = TypeVar("Found")


def start_search(
    workdir: Path, env: dict[str, str], args: list[str], faults: dict[str, dict[str, str]]
) -> subprocess.Popen:
    """`autotune search ARGS` in the background, its output discarded; `faults`: trial number -> fault."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "search", *args],
        cwd=workdir,
        env={**env, "AUTOTUNE_INJECT_FAULTS": json.dumps(faults)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def processes_of(command_pid: int, worker_pid: int) -> list[int]:
    """A command's processes while its trial runs: its descendants, the trial's worker and the fork server that forked
    it (the command's child, or forked by a fork template and then not its descendant)."""
    pids = [child.pid for child in psutil.Process(command_pid).children(recursive=True)]
    with contextlib.suppress(psutil.Error):
        pids.append(psutil.Process(worker_pid).ppid())
    return sorted({*pids, worker_pid})


def running_trial(workdir: Path, study_name: str = DEMO_STUDY) -> FrozenTrial | None:
    """The trial of a search in `workdir` that runs now, once its worker's pid is recorded; else None."""
    db = workdir / "studies" / f"{study_name}.db"
    if not db.exists():
        return None
    try:
        # open_storage: the search may be creating this database's schema right now
        trials = optuna.load_study(study_name=study_name, storage=open_storage(f"sqlite:///{db}")).trials
    except KeyError:  # the database file exists a moment before the study in it
        return None
    running = [t for t in trials if t.state == TrialState.RUNNING and "worker_pid" in t.user_attrs]
    return running[0] if running else None


def announced(trials: Path, number: int, phase: str) -> bool:
    """Whether trial `number` announced `phase` in its worker log, in `trials` (a study's folder of trial files,
    beside its SQLite file): the worker is in that phase or past it (an injected fault of that phase is reached
    the moment it is announced)."""
    try:
        text = (trials / f"trial-{number:04d}" / "worker.log").read_text(errors="replace")
    except FileNotFoundError:
        return False
    return any(phases.parse(line) == phase for line in text.splitlines())


def wait_for(
    found: Callable[[], Found | None],
    search: subprocess.Popen,
    failure: str,
    timeout_s: float = 600,
    poll_s: float = 0.5,
) -> Found:
    """Poll `found` until it returns something; fail with `failure` if the search ends or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not (result := found()):
        assert time.monotonic() < deadline and search.poll() is None, failure
        time.sleep(poll_s)
    return result


# ------------------------------------------------------------------ one search killed mid-trial, shared

KILLED_SEARCH = ["--model", "demo", "--gpu", "cpu", "--batch-size", "2", "--input-len", "32", "--output-len", "16",
                 *BRIEF]  # fmt: skip
# The third trial raises while loading and the fourth hangs there (every launched trial reaches loading, where a
# configuration that fails before it measures fails too): the search is surely mid-trial when it is killed.
KILLED_FAULTS = {"2": {"phase": "load", "kind": "raise"}, "3": {"phase": "load", "kind": "hang"}}
GONE_WITHIN_S = 15.0  # the killed search's worker and fork server must be gone by then


@dataclass(frozen=True)
class KilledSearch:
    """A search (KILLED_SEARCH, five trials) killed with SIGKILL while its fourth trial hangs: two trials complete, one
    failed with an injected error, one left RUNNING with its worker killed with the search."""

    workdir: Path  # shared: a test that resumes the search works on a copy (`copy`)
    search_pid: int
    interrupted: int  # the trial that ran when the search was killed
    outlived: list[int]  # the search's processes (its worker, the fork server) still alive GONE_WITHIN_S after

    def copy(self, destination: Path) -> Path:
        shutil.copytree(self.workdir, destination)
        return destination


def _kill_a_search_mid_trial(workdir: Path, env: dict[str, str]) -> dict[str, object]:
    process = start_search(workdir, env, [*KILLED_SEARCH, "--trials", "5"], KILLED_FAULTS)

    def fourth_trial_loading() -> FrozenTrial | None:
        trial = running_trial(workdir)
        return trial if trial is not None and trial.number >= 3 and announced(
            workdir / "studies" / DEMO_STUDY, trial.number, "load"
        ) else None  # fmt: skip

    trial = wait_for(fourth_trial_loading, process, "the search never reached its fourth trial's hang", poll_s=0.3)
    pids = processes_of(process.pid, trial.user_attrs["worker_pid"])
    process.send_signal(signal.SIGKILL)
    process.wait()
    gone_by = time.monotonic() + GONE_WITHIN_S
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < gone_by:
        time.sleep(0.2)
    return {"search_pid": process.pid, "interrupted": trial.number, "outlived": alive}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="session")
def killed_search(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> KilledSearch:
    """One search killed mid-trial, for the tests that resume one (test_faults_e2e.py: the retry; test_optuna_tools.py:
    optuna-dashboard reading while it resumes), made once for both test processes (`shared_once`)."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir)}

    def kill(workdir: Path) -> None:
        workdir.with_suffix(".json").write_text(json.dumps(_kill_a_search_mid_trial(workdir, env)))

    workdir = shared_once(tmp_path_factory, "killed", kill)
    return KilledSearch(workdir, **json.loads(workdir.with_suffix(".json").read_text()))
