"""Quality against the reference: on the trial's own decoding path, the text forced through it (KL, top-1 agreement,
perplexity) and the reference's greedy continuations (token agreement); of its timed outputs, the share of each greedy
continuation reproduced (greedy agreement); and tier 0, the share of its free-running generations that are
degenerate."""

from __future__ import annotations

from autotune.figures.metrics.metric import COLUMN, FRONT, PERCENT, REPORT, WHERE_MEASURED, Metric

KL_FLOOR = 1e-6  # the reference's KL is 0; below this, KL is noise around zero
KL_DIVERGENCE = Metric(
    "kl_divergence",
    "KL divergence vs reference",
    "nats/token",
    "minimize",
    KL_FLOOR,
    short="KL",
    axis="log10 KL",
    shown=FRONT,
    cell="{:.2e}",
    on_path=True,
    compared=COLUMN,
    aliases=(("kl", ""),),
    forecast="kl",
)
TOP1_AGREEMENT = Metric(
    "top1_agreement",
    "top-1 agreement with reference",
    "",
    "maximize",
    short="top-1",
    shown=FRONT,
    **PERCENT,
    on_path=True,
    aliases=(("top1", ""),),
)
PERPLEXITY = Metric(
    "perplexity", "perplexity", "", "minimize", shown=REPORT, column="ppl", cell="{:.2f}", on_path=True,
    aliases=(("ppl", ""),),
)  # fmt: skip
PERPLEXITY_DELTA = Metric(
    "perplexity_delta", "perplexity change vs reference", "", "minimize", on_path=True, aliases=(("ppl_delta", ""),)
)

# The reference's greedy continuations of the workload's prompts: the share of each that the trial's own outputs
# reproduced before diverging (greedy), and the share of positions where the trial, forced along them, puts the
# reference's token first (token: one early flip costs one position).
GREEDY_TOKENS = "with the reference's greedy tokens"
TOKEN_AGREEMENT = Metric(
    "token_agreement",
    "token agreement with reference",
    "",
    "maximize",
    short="tokens",
    shown=FRONT,
    **PERCENT,
    card="token agreement {}",
    card_clause=GREEDY_TOKENS,
    on_path=True,
    compared=COLUMN,
    history="agreements",
    aliases=(("tokens", ""),),
)
GREEDY_AGREEMENT = Metric(
    "greedy_agreement",
    "greedy agreement with reference",
    "",
    "maximize",
    short="greedy",
    shown=FRONT,
    **PERCENT,
    card="greedy agreement {}",
    card_clause=GREEDY_TOKENS,
    history="agreements",
    aliases=(("greedy", ""),),
)

# Tier 0, every trial: of the trial's own free-running generations, the share that are degenerate (empty, one token,
# a repetition loop, or running to the limit where the reference stopped) where the reference's are not.
GENERATIONS_JUDGED = "generations_judged"  # how many generations tier 0 judged
DEGENERATE_SHARE = Metric(
    "degenerate_share",
    "degenerate generations",
    "",
    "minimize",
    short="degenerate",
    shown=FRONT,
    **PERCENT,
    beside=GENERATIONS_JUDGED,
    optional=True,
    card="degenerate {}",
    card_clause="of its own free-running generations",
    compared=WHERE_MEASURED,
    history="degenerate",
    history_with="task_accuracy",  # tier 0 beside tier 1, on nights gated on the task (as before them, without)
    aliases=(("degenerate", ""),),
)
