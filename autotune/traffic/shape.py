"""The replayed requests in tokens, as the model's tokenizer made them (the prepare task measures it on each machine):
what the study process sizes plans by, says of the trace, and charts in the report."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrafficShape:
    """Each replayed request's input and output length in tokens, its arrival (None: the trace has none), and how
    many leading tokens of its input an earlier request of the window had already (the prefix a cache could reuse:
    the conversation's earlier turn, or shared blocks)."""

    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    reusable: tuple[int, ...]
    arrivals_s: tuple[float, ...] | None = None

    @property
    def requests(self) -> int:
        return len(self.input_lens)

    @property
    def max_tokens(self) -> int:
        """The most tokens one request holds: its input and all it generates."""
        return max(i + o for i, o in zip(self.input_lens, self.output_lens, strict=True))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def reusable_share(self) -> float:
        """The share of all input tokens an earlier request had as its prefix."""
        return sum(self.reusable) / sum(self.input_lens)

    @property
    def span_s(self) -> float | None:
        """From the first arrival to the last; None without arrivals."""
        return self.arrivals_s[-1] - self.arrivals_s[0] if self.arrivals_s else None

    def describe(self) -> str:
        """ "64 requests, 12-480 tokens in (mean 180), 5-172 out (mean 64), arriving over 31.5 s, 22% of input tokens
        an earlier request's prefix"."""
        said = [
            f"{self.requests} request{'s' if self.requests != 1 else ''}",
            f"{_range(self.input_lens)} tokens in",
            f"{_range(self.output_lens)} out",
        ]
        if self.span_s is not None:
            said.append(f"arriving over {self.span_s:.1f} s")
        if any(self.reusable):
            said.append(f"{self.reusable_share:.0%} of input tokens an earlier request's prefix")
        return ", ".join(said)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "input_lens": list(self.input_lens),
            "output_lens": list(self.output_lens),
            "reusable": list(self.reusable),
        }
        if self.arrivals_s is not None:
            data["arrivals_s"] = [round(arrival, 6) for arrival in self.arrivals_s]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrafficShape:
        arrivals = data.get("arrivals_s")
        return cls(
            tuple(data["input_lens"]),
            tuple(data["output_lens"]),
            tuple(data["reusable"]),
            tuple(arrivals) if arrivals is not None else None,
        )


def _range(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    spread = f"{low}" if low == high else f"{low}-{high}"
    return spread if low == high else f"{spread} (mean {statistics.fmean(values):.0f})"
