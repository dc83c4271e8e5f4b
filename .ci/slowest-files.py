"""The test files that took longest in a run, from pytest's JUnit XML (make test writes .cache/test-times.xml).

Each file's time is the sum of its tests' (setup, call and teardown), over both test processes: what it costs the
machine, not when it ended. Usage: python .ci/slowest-files.py [XML] [N]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter


def main(path: str = ".cache/test-times.xml", shown: str = "15") -> None:
    try:
        cases = list(ElementTree.parse(path).iter("testcase"))
    except (OSError, ElementTree.ParseError) as error:  # a run that died while pytest wrote it (a full disk, a kill)
        print(f"== slowest test files: {path} could not be read ({error})")
        return
    per_file: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for case in cases:
        name = _file(case.get("classname", ""))
        per_file[name] += float(case.get("time", 0))
        tests[name] += 1
    total = sum(per_file.values())
    print(f"== slowest test files ({len(per_file)} files, {sum(tests.values())} tests, {total:.0f} s of test time)")
    for name, seconds in per_file.most_common(int(shown)):
        print(f"  {seconds:7.1f} s  {tests[name]:3d} tests  {name}")


def _file(classname: str) -> str:
    """tests.e2e.test_search_e2e(.TestClass) -> tests/e2e/test_search_e2e.py"""
    parts = classname.split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: module + 1]) + ".py"


if __name__ == "__main__":
    main(*sys.argv[1:])
