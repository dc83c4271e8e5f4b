"""The HTML report: data computed from the study, then drawn with plotly."""

from __future__ import annotations

from pathlib import Path

from autotune import study as studies


def build_report(study_name: str, storage_url: str, out: Path) -> Path:
    """Render the report of a stored study to `out`."""
    from autotune.report.data import collect
    from autotune.report.html import write_report

    study = studies.load_stored_study(storage_url, study_name)
    return write_report(collect(study, storage_url), out)


def default_report_path(study_name: str, reports_dir: Path = Path("reports")) -> Path:
    return reports_dir / f"{study_name}.html"
