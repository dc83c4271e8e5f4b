"""Every view of a study's figures, printed from studies with known figures (tests/fakes.py), so that two commits'
outputs can be set side by side: the trial lines and the front's table a search prints, the report's cards and table
of trials, `best` (text and JSON), `compare` (table, Markdown, JSON) and `history` (table, Markdown, JSON), and the
constraint names `best --constraint` reads.

    python benchmarks/figures/views.py > /tmp/views-after.txt
    git stash; python benchmarks/figures/views.py > /tmp/views-before.txt; git stash pop; diff /tmp/views-*.txt

A refactor of how figures are shown must leave the output the same for the figures that existed before it.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.analysis.compare import GivenTolerances, compare_stored
from autotune.analysis.history import Night, history
from autotune.analysis.pick import goal_from_flags
from autotune.cli import printers
from autotune.cli.compare_printers import print_comparison
from autotune.cli.printers import TrialPrinter, print_front
from autotune.cli.study_printers import print_best, print_history
from autotune.figures.constraints import parse_constraint
from autotune.report.best import best
from autotune.report.cards import card_facts
from autotune.report.data import report_data
from autotune.report.html import render
from autotune.study.opened import OpenedStudy
from tests import fakes

CONSTRAINTS = ("kl<=0.01", "tokens>=0.9", "greedy>=0.5", "ttft_ms<=50", "memory<=3GB", "top1>=0.9", "ppl<=11")


def with_agreements(path: Path) -> tuple[object, str]:
    """A study whose trials measured token and greedy agreement (one did not: a study of before)."""
    study, url = fakes.new_study(path, "agreements", constraints=["kl<=0.01"])
    figures = (
        (fakes.REFERENCE, 100, 4.0, 0.0, 1.0, 1.0, ("reference",)),
        (fakes.BASELINE, 200, 2.0, 0.001, 0.97, 0.8, ("baseline",)),
        (fakes.COMPILED, 400, 2.2, 0.002, 0.95, 0.6, ("sampler",)),
        (fakes.FOUR_BIT, 150, 1.0, 0.05, 0.7, 0.2, ("sampler",)),
    )
    for cfg, tok_s, memory, kl, tokens, greedy, roles in figures:
        more = {"token_agreement": tokens, "greedy_agreement": greedy}
        fakes.add_complete(
            study,
            cfg,
            fakes.metrics(tok_s, memory, kl, 1 - kl, 10 + kl, **more),
            roles=roles,
            constraints={"kl_divergence<=0.01": kl - 0.01},
        )
    fakes.add_complete(study, fakes.EAGER_FP16, fakes.metrics(150, 2.1, 0.002, 0.985, 10.1), quality_path="generate")
    return study, url


def captured(call: Callable[[], object]) -> str:
    """What a printer wrote (the terminal's console and plain prints alike)."""
    buffer = io.StringIO()
    console_file = printers.out.file
    printers.out.file = buffer
    try:
        with contextlib.redirect_stdout(buffer):
            call()
    finally:
        printers.out.file = console_file
    return buffer.getvalue()


def study_views(name: str, url: str) -> str:
    opened = OpenedStudy.open(name, url)
    data = report_data(opened)
    lines = [f"===== study {name}"]
    trial_printer = TrialPrinter(printers.out)
    lines.append(captured(lambda: [trial_printer.trial_finished(record) for record in opened.launched]))
    lines.append(captured(lambda: print_front(name, data.cards, data.settings.objective_metrics, data.baseline.config)))
    for card in data.cards:
        lines += [f"card #{card.record.number}", *card_facts(card)]
    page = render(data)
    lines.append(_page_text(page))
    for output in ("table", "json"):
        found = best(name, url, [], goal_from_flags(None, None))
        lines.append(captured(lambda found=found, output=output: print_best(found, output)))
    return "\n".join(lines)


def _page_text(page: str) -> str:
    """The report without what changes from run to run (the time it was made, plotly's code and ids)."""
    page = re.sub(r"<script[^>]*>.*?</script>", "<script/>", page, flags=re.S)
    page = re.sub(r"Generated \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", "Generated <time>", page)
    page = re.sub(r"sqlite:///[^<]*/", "sqlite:///<folder>/", page)
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", page)


def comparison_views(a: tuple[str, str], b: tuple[str, str]) -> str:
    comparison = compare_stored(a[0], a[1], b[0], b[1], GivenTolerances())
    lines = [f"===== compare {a[0]} -> {b[0]}"]
    lines += [captured(lambda output=output: print_comparison(a[0], b[0], comparison, output)) for output in
              ("table", "markdown", "json")]  # fmt: skip
    return "\n".join(lines)


def history_views(studies: list[tuple[str, str]]) -> str:
    nights = history([Night.of(OpenedStudy.open(name, url)) for name, url in studies])
    lines = ["===== history " + ", ".join(name for name, _ in studies)]
    lines += [captured(lambda output=output: print_history(nights, Path("history.html"), output)) for output in
              ("table", "markdown", "json")]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    printers.out.width = 200
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        made = {
            "fake": fakes.known_study(root / "known.db", constraints=["kl<=0.01"]),
            "agreements": with_agreements(root / "agreements.db"),
            "capacity": fakes.capacity_study(root / "capacity.db"),
            "slower": fakes.capacity_study(root / "slower.db", name="slower", speed=0.7),
            "serve-capacity": fakes.serve_capacity_study(root / "serve.db"),
        }
        studies = {name: url for name, (_, url) in made.items()}
        for name, url in studies.items():
            print(study_views(name, url))
        print(comparison_views(("fake", studies["fake"]), ("agreements", studies["agreements"])))
        print(comparison_views(("agreements", studies["agreements"]), ("fake", studies["fake"])))
        print(comparison_views(("capacity", studies["capacity"]), ("slower", studies["slower"])))
        print(history_views([("fake", studies["fake"]), ("agreements", studies["agreements"])]))
        print(history_views([("capacity", studies["capacity"]), ("slower", studies["slower"])]))
    print("===== constraints")
    for text in CONSTRAINTS:
        constraint = parse_constraint(text)
        print(f"{text} -> {constraint} ({constraint.label})")


if __name__ == "__main__":
    main()
