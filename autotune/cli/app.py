"""Command line: thin commands over the library (search_commands.py: search, worker; evaluate_command.py: evaluate;
measure_commands.py: measure, ceiling; study_commands.py: compare, history, report, best, gpus, loop). Bad input ends
as one line on stderr and exit status 2."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from autotune.cli import evaluate_command, measure_commands, search_commands, study_commands
from autotune.cli.flags import FLAG
from autotune.errors import NothingSatisfiesError, OutputError, SearchError, StorageUnavailableError, UserError
from autotune.search import interrupts

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Search transformers inference configurations for the fastest, leanest one that keeps quality.",
)
for command in (
    search_commands.search,
    search_commands.worker,
    evaluate_command.evaluate,
    study_commands.compare,
    study_commands.history,
    measure_commands.measure,
    study_commands.report,
    study_commands.best,
    measure_commands.ceiling,
    study_commands.gpus,
    study_commands.loop,
):
    app.command()(command)
app.command(hidden=True)(search_commands.join)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the library does.", metavar=FLAG)] = False,
):
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def main() -> None:
    """Entry point: run the app; known errors become one line without a traceback."""
    try:
        code = app(standalone_mode=False)
    except (UserError, typer.TyperException) as error:  # TyperException: click's usage errors
        message = error.format_message() if isinstance(error, typer.TyperException) else str(error)
        if message:  # empty after no_args_is_help printed the help
            print(f"autotune: error: {message}", file=sys.stderr)
        sys.exit(2)
    except SearchError as error:
        print(f"autotune: search stopped: {error}", file=sys.stderr)
        sys.exit(1)
    except NothingSatisfiesError as error:
        print(f"autotune: nothing satisfies the constraints: {error}", file=sys.stderr)
        sys.exit(NothingSatisfiesError.EXIT_STATUS)
    except OutputError as error:
        print(f"autotune: {error}", file=sys.stderr)
        sys.exit(1)
    except StorageUnavailableError as error:
        print(f"autotune: storage unavailable: {error}", file=sys.stderr)
        sys.exit(interrupts.pending_exit_status() or StorageUnavailableError.EXIT_STATUS)
    except interrupts.Interrupted as interrupt:
        print(f"autotune: {interrupts.summary(interrupt)}", file=sys.stderr)
        sys.exit(interrupt.exit_status)
    except (KeyboardInterrupt, typer.Abort):
        print("autotune: interrupted; the study keeps every finished trial", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
