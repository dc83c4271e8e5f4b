"""A request trace replayed (--traffic): the tokens its requests asked for, per second of the replay, of those that met
the SLO (all of them without one: what static batching ran past a request's end does not count); the share of
generate()'s decode steps spent on rows whose request had ended; how much each replay served; the share of input
tokens read from a prefix a cache reused."""

from __future__ import annotations

from autotune.figures.metrics.metric import FRONT, PERCENT, REPORT, WHERE_MEASURED, Metric

GOODPUT_TOKENS = Metric(
    "goodput_tok_s",
    "goodput: requested tokens/s (within the SLO, if any)",
    "tok/s",
    "maximize",
    short="goodput",
    shown=FRONT,
    column="goodput tok/s",
    cell="{:.1f}",
    optional=True,
    line="goodput {} tok/s",
    compared=WHERE_MEASURED,
    aliases=(("goodput_tokens", "tok/s"),),
    forecast="speed",
)
WASTED_SHARE = Metric(
    "wasted_share",
    "decode steps on rows whose request had ended",
    "",
    "minimize",
    short="wasted",
    shown=FRONT,
    **PERCENT,
    optional=True,
    line="wasted {} of decode steps",
    compared=WHERE_MEASURED,
    aliases=(("wasted", ""),),
)
REQUESTS_SERVED = Metric("requests_served", "trace requests served per replay", "")
TOKENS_GENERATED = Metric("tokens_generated", "tokens the trace's requests asked for and received, per replay", "")
PREFIX_HIT_RATE = Metric(
    "prefix_hit_rate",
    "share of input tokens read from a reused prefix",
    "",
    "maximize",
    short="prefix hits",
    shown=REPORT,
    **PERCENT,
    optional=True,
    compared=WHERE_MEASURED,
    aliases=(("prefix_hits", ""),),
)
