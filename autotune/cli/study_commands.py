"""The commands that read stored studies: `compare`, `history`, `report`, `best`, and `gpus` (this machine's
profiles). Each checks its flags, calls the library and prints what it returns."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autotune.cli.compare_printers import print_comparison
from autotune.cli.flags import (
    FLAG,
    Constraints,
    FormatJson,
    OldReportFlag,
    Storage,
    StoragePatienceS,
    Study,
    ToleranceFlags,
    report_path,
    with_groups,
)
from autotune.cli.printers import out, print_gpus
from autotune.cli.study_printers import print_best, print_history
from autotune.errors import UserError
from autotune.figures.constraints import Constraint
from autotune.space.knobs import KNOBS
from autotune.space.knobs.decoding import DecodeLoopKnob, default_folder, loop_names

if TYPE_CHECKING:
    from autotune.study import Waiting


class CompareFormat(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


@with_groups
def compare(
    *,
    study_a: Annotated[str, typer.Argument(metavar="STUDY_A", help="The earlier study (e.g. last night's).")],
    study_b: Annotated[str, typer.Argument(metavar="STUDY_B", help="The later study.")],
    storage_url: Storage = None,
    storage_url_b: Annotated[
        str | None, typer.Option("--storage-b", help="Storage of STUDY_B.", show_default="--storage")
    ] = None,
    tolerances: ToleranceFlags,
    output: Annotated[
        CompareFormat, typer.Option("--format", help="table, json, or markdown (a CI job summary).")
    ] = CompareFormat.table,
    as_json: FormatJson = False,
    across_traffic: Annotated[
        bool,
        typer.Option(
            "--across-traffic",
            help="Compare studies that replayed other traffic (--traffic) anyway: their figures measure other "
            "requests.",
            metavar=FLAG,
        ),
    ] = False,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Compare two studies: how each front configuration's figures moved; exit 3 on a regression.

    A regression: at a point of STUDY_A's front, STUDY_B's best throughput at that memory and KL is lower.

    Where both were evaluated on a task (--eval), a configuration answering fewer items right, or flipping more, too.

    Studies searched with an SLO compare their figures at capacity, and only under the same SLO.

    Each figure has its own tolerance, by the device of STUDY_A, above that figure's run-to-run noise there.

    Example: autotune compare night-1 night-2 --format markdown >> "$GITHUB_STEP_SUMMARY"
    """
    from autotune.analysis.compare import compare_stored
    from autotune.study import default_storage_url

    url_a = storage_url or default_storage_url(study_a)
    url_b = storage_url_b or storage_url or default_storage_url(study_b)
    waiting = _waiting(storage_patience_s)
    comparison = compare_stored(study_a, url_a, study_b, url_b, tolerances, waiting, across_traffic)
    print_comparison(study_a, study_b, comparison, "json" if as_json else output.value)
    if comparison.regression:
        raise typer.Exit(3)


class HistoryFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


@with_groups
def history(
    *,
    studies_named: Annotated[
        str, typer.Option("--studies", help="Comma-separated study names or glob patterns: 'demo-cpu-2026-11-*'.")
    ],
    storage_url: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Storage of every study.", show_default="each study's sqlite:///studies/<study>.db"
        ),
    ] = None,
    report_file: Annotated[
        Path | None, typer.Option("--report", help="The chart (HTML).", show_default="reports/history.html")
    ] = None,
    old_report_flag: OldReportFlag = None,
    tolerances: ToleranceFlags,
    output: Annotated[
        HistoryFormat, typer.Option("--format", help="What to print: table, markdown (a CI job summary) or json.")
    ] = HistoryFormat.table,
    as_json: FormatJson = False,
    artifacts: Annotated[
        str | None,
        typer.Option("--artifacts", help="Also store the chart with the last night's study: a folder, s3://, gs://."),
    ] = None,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Nights side by side: each study's front (best throughput, memory, KL), regressions marked, as a chart.

    The studies are ordered by the date in their names (YYYY-MM-DD).

    Each night is compared with the one before as `autotune compare` does, with the same tolerances.

    Example: autotune history --studies 'demo-cpu-2026-11-*' --report reports/nights.html
    """
    from autotune.report import build_history

    names = [name.strip() for name in studies_named.split(",") if name.strip()]
    if not names:
        raise UserError("--studies: name at least one study or pattern, e.g. 'demo-cpu-2026-11-*'")
    out_path = report_path(report_file, old_report_flag) or Path("reports/history.html")
    nights, path = build_history(names, storage_url, out_path, tolerances, artifacts, _waiting(storage_patience_s))
    print_history(nights, path, "json" if as_json else output.value)


@with_groups
def report(
    *,
    study: Study,
    storage_url: Storage = None,
    report_file: Annotated[
        Path | None, typer.Option("--report", help="HTML report.", show_default="reports/<study>.html")
    ] = None,
    old_report_flag: OldReportFlag = None,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Render the HTML report of a stored study again."""
    from autotune.report import build_report, default_report_path
    from autotune.study import default_storage_url

    out_path = report_path(report_file, old_report_flag) or default_report_path(study)
    path = build_report(study, storage_url or default_storage_url(study), out_path, _waiting(storage_patience_s))
    out.print(f"report: {path}")


class Format(str, Enum):
    table = "table"
    json = "json"
    python = "python"
    serve = "serve"


@with_groups
def best(
    *,
    study: Study,
    storage_url: Storage = None,
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory at most this: 20GB, 512MB (GB if bare).")
    ] = None,
    max_kl: Annotated[float | None, typer.Option("--max-kl", help="KL divergence vs the reference at most.")] = None,
    min_throughput: Annotated[
        float | None, typer.Option("--min-throughput", help="Decode throughput at least (tok/s).")
    ] = None,
    constraint: Constraints = None,
    maximize: Annotated[
        str | None, typer.Option("--maximize", help="What to maximize: throughput (default), top1, ...")
    ] = None,
    minimize: Annotated[
        str | None, typer.Option("--minimize", help="What to minimize: memory, kl, ttft, cost...")
    ] = None,
    output: Annotated[Format, typer.Option("--format", help="table, json, python or serve.")] = Format.table,
    as_json: FormatJson = False,
    storage_patience_s: StoragePatienceS,
) -> None:
    """Pick one configuration of a study under constraints and print it.

    The study's own --constraint flags from `autotune search` apply too.

    Exit status 3 when no complete trial satisfies them, so a nightly job can act on it.

    Example: autotune best --study demo-cpu --max-memory 20GB --max-kl 0.01 --format json
    """
    from autotune.analysis.pick import goal_from_flags
    from autotune.report.best import best as pick_best
    from autotune.study import default_storage_url

    asked = _asked_constraints(max_memory, max_kl, min_throughput, constraint or [])
    goal = goal_from_flags(maximize, minimize)
    found = pick_best(study, storage_url or default_storage_url(study), asked, goal, _waiting(storage_patience_s))
    print_best(found, Format.json.value if as_json else output.value)


def _asked_constraints(
    max_memory: str | None, max_kl: float | None, min_throughput: float | None, constraints: list[str]
) -> list[Constraint]:
    """`best`'s shortcut flags as constraints, then its --constraint flags."""
    from autotune.figures.constraints import parse_constraint, parse_constraints

    shortcuts = [
        parse_constraint(f"{name}{op}{value}", f"{flag} {str(value)!r}")
        for flag, name, op, value in (
            ("--max-memory", "memory", "<=", max_memory),
            ("--max-kl", "kl", "<=", max_kl),
            ("--min-throughput", "throughput", ">=", min_throughput),
        )
        if value is not None
    ]
    return parse_constraints([*map(str, shortcuts), *constraints])


def _waiting(patience_s: float) -> Waiting:
    """How a command that reads studies waits out their storage: for --storage-patience, saying so on stderr (its
    output may be JSON)."""
    from autotune.study import Waiting

    return Waiting(patience_s, lambda line: print(f"note: {line}", file=sys.stderr, flush=True))


def gpus() -> None:
    """List the hardware profiles and the GPU detected here."""
    from autotune.profiles import PROFILES, detect_gpus

    print_gpus(PROFILES.values(), detect_gpus())


# The decode_loop knob's loops, as its handler names them: the one it expects fastest on a GPU first.
LOOPS_FASTEST_FIRST = " or ".join(
    sorted(loop_names(), key=lambda loop: -KNOBS[DecodeLoopKnob.name].expect(loop, "cuda").speed)
)


def loop(
    name: Annotated[str, typer.Argument(metavar="NAME", help=f"The decoding loop: {LOOPS_FASTEST_FIRST}.")],
    out_folder: Annotated[
        Path | None, typer.Option("--out", help="The folder to write.", show_default="./autotune-NAME")
    ] = None,
) -> None:
    """Write one of autotune's decoding loops (the decode_loop knob) as a folder to keep beside your code.

    With custom_generate=FOLDER and trust_remote_code=True, generate runs it in place of its own loop.

    The Python that best and the report print for a configuration with decode_loop expects it in ./autotune-NAME.

    Example: autotune loop fused-step --out ./autotune-fused-step
    """
    from autotune.report.loop_folder import write_loop_folder

    folder = str(out_folder) if out_folder is not None else default_folder(name)
    entry = write_loop_folder(name, Path(folder))
    out.print(
        f"wrote {entry}: generate(..., custom_generate={folder!r}, trust_remote_code=True) runs "
        f"decode_loop={name} in place of generate()'s own loop"
    )
