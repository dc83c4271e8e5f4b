"""Under load: the serve workload's figures (transformers serve driven by a load generator), each load level's, and the
capacity, the largest batch or load within the SLO (figures/capacity.py decides it)."""

from __future__ import annotations

from autotune.figures.metrics.metric import WHERE_MEASURED, Metric

GOODPUT = Metric(
    "goodput_req_s", "goodput: requests/s within the SLOs", "req/s", "maximize",
    aliases=(("goodput", "req/s"),), forecast="speed",
)  # fmt: skip
REQUESTS_PER_S = Metric(
    "requests_per_s", "completed requests per second", "req/s", "maximize",
    aliases=(("req_s", "req/s"),), forecast="speed",
)  # fmt: skip
ERRORS = Metric("errors", "failed requests", "", "minimize")
CAPACITY = Metric(
    "capacity", "capacity: the largest batch or load within the SLO", "", "maximize", column="capacity",
    compared=WHERE_MEASURED,
)  # fmt: skip
MEETS_SLO_FIGURE = Metric("meets_slo", "meets the SLO at some batch or load (1 yes, 0 no)", "")

# Figures a load level (a point of a capacity probe) reports that are no metric of a study (no label, never an
# objective).
OUTPUT_TOK_S = "output_tok_s"  # a load level: the server's generated tokens/s
SLO_SHARE = "slo_share"  # a load level: the share of its requests within the SLO
REQUESTS = "requests"  # a load level: the requests it sent
IN_FLIGHT_PEAK = "in_flight_peak"  # a load level: the most requests in flight at once
