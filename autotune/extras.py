"""The features behind an extra of `pip install autotune[...]`, and the one line that says which to install.

The core install (`pip install autotune`, no extra) runs search, measure, worker on SQLite, report,
best, compare and gpus. A feature behind an extra, asked for where the extra is not installed, is bad
input: one line naming the extra. Checked with `importlib.util.find_spec`, which imports nothing (the
study process never imports torch, and torchao or optimum-quanto would import it).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Package:
    """A package a feature needs: the module to look for, its name on PyPI, and the extra that installs it."""

    module: str
    name: str
    extra: str | None  # None: a dependency of the core install (it was uninstalled since)

    @property
    def install(self) -> str:
        return install_line(self.extra) if self.extra else f"pip install {self.name}"


SERVE = (  # --workload serve: the serving packages transformers names, and the load client
    Package("fastapi", "fastapi", "serve"),
    Package("uvicorn", "uvicorn", "serve"),
    Package("openai", "openai", "serve"),
    Package("httpx", "httpx", "serve"),
)
POSTGRES = (Package("psycopg", "psycopg", "postgres"),)  # a postgresql+psycopg:// storage
DASHBOARD = (Package("optuna_dashboard", "optuna-dashboard", "dashboard"),)  # optuna-dashboard on a study
TORCHAO = Package("torchao", "torchao", "quant")
QUANTO = Package("optimum.quanto", "optimum-quanto", "quant")
HQQ = Package("hqq", "hqq", "quant")
BITSANDBYTES = Package("bitsandbytes", "bitsandbytes", None)
EVAL = (Package("lm_eval", "lm-eval", "eval"),)  # search --eval: lm-evaluation-harness


def installed(module: str) -> bool:
    """Whether `module` can be imported here, found without importing it or its parent packages."""
    top, *children = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except ValueError:  # a broken installation
        return False
    for depth in range(1, len(children) + 1):  # each child in its parent's folders, the parent left unimported
        if spec is None or spec.submodule_search_locations is None:
            return False
        name = ".".join([top, *children[:depth]])
        spec = importlib.machinery.PathFinder.find_spec(name, list(spec.submodule_search_locations))
    return spec is not None


def missing(packages: Sequence[Package]) -> list[Package]:
    return [package for package in packages if not installed(package.module)]


def install_line(extra: str) -> str:
    return f'pip install "autotune[{extra}]"'


def why_missing(feature: str, packages: Sequence[Package]) -> str | None:
    """The line saying what `feature` needs and which extra installs it, or None when all is installed."""
    absent = missing(packages)
    if not absent:
        return None
    names = ", ".join(package.name for package in absent)
    verb = "is" if len(absent) == 1 else "are"
    extras = " and ".join(dict.fromkeys(package.install for package in absent))
    return f"{feature} needs {names}, which {verb} not installed: {extras}"


def why_storage_missing(url: str) -> str | None:
    """The line naming what a PostgreSQL storage URL needs here, or None (other URLs: SQLAlchemy says).

    `postgresql://` takes whichever driver is installed (psycopg2, SQLAlchemy's default for it, or psycopg 3)."""
    scheme = url.split("://", 1)[0]
    if scheme == "postgresql+psycopg":
        return why_missing("--storage postgresql+psycopg://", POSTGRES)
    if scheme == "postgresql+psycopg2" and not installed("psycopg2"):
        return "--storage postgresql+psycopg2:// needs psycopg2, which is not installed: pip install psycopg2-binary"
    if scheme == "postgresql" and not installed("psycopg2") and not installed("psycopg"):
        driver = "psycopg (or psycopg2)"
        return f"--storage postgresql:// needs {driver}, which is not installed: {install_line('postgres')}"
    return None
