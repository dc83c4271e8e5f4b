"""benchmarks/traffic/replays_table.py: the rows of a GPU session's traffic phase, from measure's JSON documents."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks import tool

replays_table = tool("traffic/replays_table.py")


def test_each_document_is_a_row_and_what_did_not_run_says_so(tmp_path: Path, capsys) -> None:
    metrics = {"goodput_tok_s": 2051.4, "wasted_share": 0.0, "requests_served": 16, "tokens_generated": 955}
    (tmp_path / "traffic-continuous.json").write_text(json.dumps({"outcome": "ok", "message": "", "metrics": metrics}))
    oom = {"outcome": "oom", "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "metrics": {}}
    (tmp_path / "traffic-static.json").write_text(json.dumps(oom))
    (tmp_path / "traffic-cut.json").write_text("")  # the phase's timeout killed it before it printed
    replays_table.main([str(tmp_path / f"traffic-{name}.json") for name in ("continuous", "static", "cut")])
    header, rule, *rows = capsys.readouterr().out.splitlines()
    assert header.startswith("| configuration | goodput tok/s | wasted |") and rule.count("|---") == 8
    assert rows[0].startswith("| traffic-continuous | 2051.4 | 0.0% | 16 | 955 | - |")
    assert rows[1].startswith("| traffic-static | oom: CUDA out of memory.")
    assert rows[2].startswith("| traffic-cut | no result (see traffic-cut.log) |")
    assert all(row.count("|") == header.count("|") for row in rows)
