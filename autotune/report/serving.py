"""The serve workload in the report: latency against load for one configuration, as an HTML table."""

from __future__ import annotations

from html import escape
from typing import Any

from autotune.figures.slo import describe_slo

_COLUMNS = (
    ("completed req/s", "requests_per_s", 1.0, "{:.2f}"),
    ("goodput req/s", "goodput_req_s", 1.0, "{:.2f}"),
    ("output tok/s", "output_tok_s", 1.0, "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_s", 1000.0, "{:.1f}"),
    ("TTFT p95 ms", "ttft_p95_s", 1000.0, "{:.1f}"),
    ("ITL p95 ms", "itl_p95_s", 1000.0, "{:.2f}"),
    ("e2e p95 ms", "e2e_p95_s", 1000.0, "{:.0f}"),
    ("errors", "errors", 1.0, "{:.0f}"),
)


def load_facts(serve: dict[str, Any], metrics: dict[str, float]) -> list[str]:
    """Sentences for a serve trial's card: goodput under the SLOs, errors, energy where measured."""
    slo = describe_slo(serve.get("slo") or {}) or "no SLO given: every completed request counts"
    facts = [f"goodput {metrics.get('goodput_req_s', 0.0):.2f} req/s ({slo}), {metrics.get('errors', 0):.0f} failed"]
    if "energy_j_per_token" in metrics:
        facts.append(f"{metrics['energy_j_per_token']:.3g} J per generated token (GPU energy counter)")
    return facts


def load_table(serve: dict[str, Any]) -> str:
    """One row per load level: what was offered and the latency the server answered with."""
    offered = "requests/s offered" if serve.get("mode") == "rate" else "concurrent clients"
    header = "".join(f"<th>{escape(label)}</th>" for label in (offered, *(c[0] for c in _COLUMNS), "SLO met"))
    rows = []
    for level in serve.get("levels", []):
        cells = [f"{level['load']:g}"]
        cells += [_cell(level.get(key), scale, form) for _, key, scale, form in _COLUMNS]
        cells.append("yes" if level.get("slo_met") else "no")
        rows.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    return (
        "<table class='load'><caption>latency against load (transformers serve, warm-up requests excluded)"
        f"</caption><tr>{header}</tr>{''.join(rows)}</table>"
    )


def _cell(value: float | None, scale: float, form: str) -> str:
    return "-" if value is None else form.format(value * scale)
