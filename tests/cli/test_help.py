"""Every command's --help, rendered as a user sees it, without broken fragments."""

from __future__ import annotations

import itertools
import re

import pytest
from typer.testing import CliRunner

from autotune.cli import app

COMMANDS = sorted(command.name or command.callback.__name__ for command in app.registered_commands)
EVERY_HELP = ["", *COMMANDS]  # "": `autotune --help` itself
# What rich leaves when it swallows "[default: ...]" written in a help string: "Study name ."
SWALLOWED = re.compile(r"\w \.(\s|$)|\(\s*\)|\[\s*\]")


def render_help(command: str) -> str:
    # Wide enough that rich wraps nothing: every line break left is one written in the source.
    args = [command, "--help"] if command else ["--help"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def description(text: str) -> list[str]:
    """The lines between the usage line and the first box of options."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("Usage:")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    return lines[start:end]


def test_every_command_is_checked():
    assert {"search", "worker", "measure", "compare", "report", "best", "gpus"} <= set(COMMANDS)


@pytest.mark.parametrize("command", EVERY_HELP)
def test_help_has_no_swallowed_defaults_or_empty_brackets(command):
    text = render_help(command)
    assert not SWALLOWED.findall(text), [line for line in text.splitlines() if SWALLOWED.search(line)]


@pytest.mark.parametrize("command", EVERY_HELP)
def test_help_paragraphs_do_not_break_mid_sentence(command):
    lines = description(render_help(command))
    for line, following in itertools.pairwise(lines):
        assert not (line and following and not line.endswith((".", ":"))), f"broken after {line!r}"


@pytest.mark.parametrize("command", EVERY_HELP)
def test_usage_names_arguments_in_capitals(command):
    usage = next(line for line in render_help(command).splitlines() if "Usage:" in line)
    arguments = re.findall(r"[{\[]([^}\]]+)[}\]]", usage)  # Typer writes {REQUIRED} and [OPTIONAL]
    assert all(argument.isupper() for argument in arguments), usage


def test_defaults_that_are_not_values_are_shown_as_typer_shows_defaults():
    text = render_help("search")
    shown = ("[default: (sqlite:///studies/<study>.db)]", "[default: (<model>-<profile>)]", "[default: (from --gpu)]")
    assert all(default in text for default in shown)


@pytest.mark.parametrize("command", EVERY_HELP)
def test_an_on_off_flag_shows_no_value_to_give(command):
    """`--json <bool>` reads as if the flag took a value; it takes none."""
    for line in render_help(command).splitlines():
        if "--help" not in line:
            assert not re.search(r"--[\w-]+\s+<bool>", line), line
