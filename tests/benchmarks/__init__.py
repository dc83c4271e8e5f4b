"""Tests of the maintained tools of benchmarks/ (benchmarks/README.md). The tools are scripts, not a package: a test
loads the one it checks from its file, as `python benchmarks/FOLDER/TOOL.py` runs it, or runs it as a process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[2] / "benchmarks"


def tool(path: str) -> ModuleType:
    """The script benchmarks/PATH as a module, loaded once, its __main__ part not run."""
    name = f"benchmarks_tool_{Path(path).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]
