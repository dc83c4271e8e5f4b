"""Command line: thin commands (app), the option groups they share (flags), what they print (printers, progress)."""

from autotune.cli.app import app, main

__all__ = ["app", "main"]
