"""Counts of the house, for any commit: where a trial's result crosses the process boundary as untyped data, where an
SLO is judged, where the report rebuilds what the opened study already read, and how much the search package holds.
Set two commits' outputs side by side to see what a redesign changed (docs/design.md).

- dict-typed fields crossing the process boundary: the fields of every dataclass a task spec or a task result
  carries (TaskSpec, TaskResult and the dataclasses their fields name, followed through imports) whose type is a
  dict or a Mapping, those of them holding Any (a record read by key) counted apart, and those of a plan itself
  (space/plan.py: its arguments by name, a map by nature, followed once the plan crosses as a Plan) apart;
- places that judge an SLO: functions that compare a figure with a bound taken from an SLO (a loop or comprehension
  over `<...slo...>.items()` comparing with the bound), and expressions that find the largest point within it (a
  `max(...)` over points whose verdict is "met");
- places that rebuild the terms: calls that build a study's terms or the SLO target its capacities are judged by
  (`Terms.of`, `Terms(...)`, `slo_target(...)`) outside the module that defines Terms, and calls of `at_capacity`
  (a record's capacity point and its figures computed) by module;
- modules in search/: its modules and lines;
- readers of older stored forms outside study/migrations.py: functions whose docstring says what was stored or
  written before (by older versions) kept or said, other than those that write (to_json) or point to the migrations;
- benchmark scripts that import from tests/;
- Plan.from_json call sites: where a plan that crossed as a dict is rebuilt, by module;
- build_plan calls per trial: its call sites on one trial's path (search/loop.py, search/trial.py), and every site;
- modules over 400 lines, with their lines;
- homes of "ceiling" and of "capacity": the modules named by the word (ceiling.py, ceilings.py, capacity_chart.py,
  or a folder of that name), and the packages they are in;
- test-only lines in product modules: outside autotune/testing/ (the tests' own package, where it exists), the lines
  of what only the tests use (TEST_ONLY: the planted and injected faults, the storage moments, the replay harness;
  the switch to the tests' package, autotune/for_tests.py, where it exists), and the lines that reach it (a line
  naming a task's fault, the moments, or the switch).

With `--kind-exercise BASE..BRANCH`, also the files of the package a branch touched (the exercise of adding a kind
like `serve`: docs/design.md), by package; with `--knob-exercise BASE..BRANCH`, the files a branch adding a knob of a
new vocabulary touched, or a value of one (a loop of decode_loop: docs/adding-a-knob.md), all of them and those of
the package.

    python benchmarks/design/count_house.py                  # the working tree's HEAD
    python benchmarks/design/count_house.py bc744e6          # any commit
    python benchmarks/design/count_house.py HEAD --kind-exercise bc744e6..kind-exercise
    python benchmarks/design/count_house.py 5bb2cda --knob-exercise e1b3d89^..e1b3d89   # decode_loop, as it came
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "autotune"
CROSSING = ("TaskSpec", "TaskResult")  # what the study process and the trial worker write to each other


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


class Tree:
    """The package's Python modules at one commit, parsed."""

    def __init__(self, rev: str) -> None:
        self.rev = rev
        paths = git("ls-tree", "-r", "--name-only", rev, "--", PACKAGE).split()
        self.modules = {path: ast.parse(git("show", f"{rev}:{path}"), path) for path in paths if path.endswith(".py")}

    def module_path(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        return next((path for path in (f"{base}.py", f"{base}/__init__.py") if path in self.modules), None)


def short(path: str) -> str:
    return path.removeprefix(f"{PACKAGE}/")


# ------------------------------------------------------------------------------ the process boundary


@dataclass(frozen=True)
class DataField:
    owner: str  # class name
    path: str  # the module that defines it
    name: str
    annotation: str


@dataclass
class DataClass:
    name: str
    path: str
    fields: list[DataField] = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)  # name -> module it is imported from


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)


def _imports(tree: ast.Module) -> dict[str, str]:
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


def dataclasses_of(tree: Tree) -> dict[tuple[str, str], DataClass]:
    """(module path, class name) -> its fields, for every dataclass of the package."""
    found = {}
    for path, module in tree.modules.items():
        imports = _imports(module)
        for node in module.body:
            if isinstance(node, ast.ClassDef) and _is_dataclass(node):
                known = DataClass(node.name, path, imports=imports)
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        annotation = ast.unparse(item.annotation)
                        if not annotation.startswith("ClassVar"):
                            known.fields.append(DataField(node.name, path, item.target.id, annotation))
                found[(path, node.name)] = known
    return found


def _resolve(tree: Tree, classes: dict[tuple[str, str], DataClass], owner: DataClass, name: str) -> DataClass | None:
    if (owner.path, name) in classes:
        return classes[(owner.path, name)]
    module = owner.imports.get(name)
    path = tree.module_path(module) if module else None
    if path is None:
        return None
    if (path, name) in classes:
        return classes[(path, name)]
    reexported = _imports(tree.modules[path]).get(name)  # a package's __init__ that re-exports it
    again = tree.module_path(reexported) if reexported else None
    return classes.get((again, name)) if again else None


def crossing_classes(tree: Tree) -> list[DataClass]:
    """The dataclasses a task spec or a task result carries, themselves included."""
    classes = dataclasses_of(tree)
    todo = [known for known in classes.values() if known.name in CROSSING]
    seen: dict[tuple[str, str], DataClass] = {}
    while todo:
        known = todo.pop()
        if (known.path, known.name) in seen:
            continue
        seen[(known.path, known.name)] = known
        for data_field in known.fields:
            for node in ast.walk(ast.parse(data_field.annotation, mode="eval")):
                if isinstance(node, ast.Name) and (found := _resolve(tree, classes, known, node.id)) is not None:
                    todo.append(found)
    return sorted(seen.values(), key=lambda known: (known.path, known.name))


def dict_typed(annotation: str) -> bool:
    names = {node.id for node in ast.walk(ast.parse(annotation, mode="eval")) if isinstance(node, ast.Name)}
    return bool(names & {"dict", "Mapping", "MutableMapping"})


def holds_any(annotation: str) -> bool:
    return "Any" in {node.id for node in ast.walk(ast.parse(annotation, mode="eval")) if isinstance(node, ast.Name)}


PLAN_MODULE = f"{PACKAGE}/space/plan.py"  # a plan's own fields: arguments by name (from_pretrained's, generate()'s)


def boundary(tree: Tree) -> list[str]:
    classes = crossing_classes(tree)
    fields = [data_field for known in classes for data_field in known.fields if dict_typed(data_field.annotation)]
    untyped = [data_field for data_field in fields if holds_any(data_field.annotation)]
    arguments = [data_field for data_field in fields if data_field.path == PLAN_MODULE]
    others = [data_field for data_field in fields if data_field.path != PLAN_MODULE]
    lines = [
        f"dict-typed fields crossing the process boundary: {len(fields)} ({len(untyped)} of them holding Any), "
        f"in {len(classes)} dataclasses carried by {' and '.join(CROSSING)}; of them, a plan's own arguments by name "
        f"(space/plan.py, followed where a plan crosses typed): {len(arguments)}; the others: {len(others)} "
        f"({len([data_field for data_field in others if holds_any(data_field.annotation)])} holding Any)"
    ]
    for data_field in fields:
        mark = "  [Any]" if holds_any(data_field.annotation) else ""
        named = f"{data_field.owner}.{data_field.name}: {data_field.annotation}"
        lines.append(f"  {named}{mark}  ({short(data_field.path)})")
    return lines


# ------------------------------------------------------------------------------ the SLO


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(module: ast.AST) -> Iterator[Function]:
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _bound_names(loop: ast.comprehension | ast.For) -> set[str]:
    """The loop's names bound to a value of `<...slo...>.items()`: `for name, bound in slo.items()` -> {bound}."""
    source = loop.iter
    if not (isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and source.func.attr == "items"):
        return set()
    if "slo" not in ast.unparse(source.func.value).lower():
        return set()
    target = loop.target
    if isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name):
        return {target.elts[1].id}
    return set()


def _compares_with(node: ast.AST, names: set[str]) -> bool:
    for compare in ast.walk(node):
        if isinstance(compare, ast.Compare):
            sides = [compare.left, *compare.comparators]
            if any(isinstance(side, ast.Name) and side.id in names for side in sides):
                return True
    return False


def _inner_functions(function: Function) -> Iterator[Function]:
    return (inner for inner in _functions(function) if inner is not function)


def judges_slo(function: Function) -> bool:
    for node in ast.walk(function):
        loops: list[tuple[ast.AST, ast.comprehension | ast.For]] = []
        if isinstance(node, ast.For):
            loops.append((node, node))
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            loops += [(node, generator) for generator in node.generators]
        for body, loop in loops:
            if (names := _bound_names(loop)) and _compares_with(body, names):
                return True
    return False


def finds_largest_met(node: ast.AST) -> bool:
    """`max(... verdict == "met" ...)`: the largest point within the SLO."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "max"):
        return False
    return any(
        isinstance(inner, ast.Compare)
        and any(isinstance(side, ast.Constant) and side.value == "met" for side in [inner.left, *inner.comparators])
        for inner in ast.walk(node)
    )


def slo(tree: Tree) -> list[str]:
    judging = [
        f"{short(path)}:{function.name}"
        for path, module in tree.modules.items()
        for function in _functions(module)
        if judges_slo(function) and not any(judges_slo(inner) for inner in _inner_functions(function))
    ]
    largest = sorted(
        f"{short(path)}:{node.lineno}"
        for path, module in tree.modules.items()
        for node in ast.walk(module)
        if finds_largest_met(node)
    )
    return [
        f"places that judge an SLO (a figure compared with an SLO's bound): {len(judging)}: {', '.join(judging)}",
        f"places that find the largest point within the SLO: {len(largest)}: {', '.join(largest)}",
    ]


# ------------------------------------------------------------------------------ the terms


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


def terms(tree: Tree) -> list[str]:
    home = next(
        (
            path
            for path, module in tree.modules.items()
            if any(isinstance(node, ast.ClassDef) and node.name == "Terms" for node in module.body)
        ),
        None,
    )
    rebuilt: Counter[str] = Counter()
    capacities: Counter[str] = Counter()
    for path, module in tree.modules.items():
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            called = _called(node)
            if called in ("Terms.of", "Terms", "slo_target") and path != home:
                rebuilt[short(path)] += 1
            if called == "at_capacity":
                capacities[short(path)] += 1
    return [
        f"places that rebuild the terms outside {short(home) if home else '(no Terms)'}: {sum(rebuilt.values())}: "
        + ", ".join(f"{path} {count}" for path, count in sorted(rebuilt.items())),
        f"calls of at_capacity (a record's capacity figures computed): {sum(capacities.values())}: "
        + ", ".join(f"{path} {count}" for path, count in sorted(capacities.items())),
    ]


# ------------------------------------------------------------------------------ older stored forms

OLDER = re.compile(r"(stored|written)( by older versions| before)", re.IGNORECASE)
KEPT = re.compile(r"\b(kept|said)\b")
MIGRATIONS = f"{PACKAGE}/study/migrations.py"


def older_forms(tree: Tree) -> list[str]:
    readers = []
    for path, module in tree.modules.items():
        for function in _functions(module):
            said = " ".join((ast.get_docstring(function) or "").split())
            reads_older = OLDER.search(said) and KEPT.search(said) and "migrations" not in said
            if path != MIGRATIONS and function.name != "to_json" and reads_older:
                readers.append(f"{short(path)}:{function.name}")
    return [f"readers of older stored forms outside {short(MIGRATIONS)}: {len(readers)}: {', '.join(sorted(readers))}"]


# ------------------------------------------------------------------------------ search/ and the benchmarks


def search_package(tree: Tree) -> list[str]:
    paths = sorted(path for path in tree.modules if path.startswith(f"{PACKAGE}/search/"))
    named = [path for path in paths if not path.endswith("__init__.py")]
    lines = sum(len(git("show", f"{tree.rev}:{path}").splitlines()) for path in paths)
    listed = ", ".join(Path(path).stem for path in named)
    return [f"modules in search/: {len(named)} ({lines} lines, __init__ included): {listed}"]


def benchmarks_importing_tests(rev: str) -> list[str]:
    found = git("grep", "-l", "-E", r"^\s*(from tests[. ]|import tests)", rev, "--", "benchmarks").split()
    paths = sorted(line.split(":", 1)[1] for line in found)
    return [f"benchmark scripts that import from tests/: {len(paths)}: {', '.join(paths)}"]


# ------------------------------------------------------------------------------ plans


def calls_of(tree: Tree, name: str) -> Counter[str]:
    """Calls of `name` (a function, or Class.method), by module."""
    found: Counter[str] = Counter()
    for path, module in tree.modules.items():
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and _called(node) == name:
                found[short(path)] += 1
    return found


TRIAL_PATH = ("search/loop.py", "search/trial.py")  # the modules one trial of a search runs through, in the study


def plans(tree: Tree) -> list[str]:
    rebuilt = calls_of(tree, "Plan.from_json")
    built = calls_of(tree, "build_plan")
    per_trial = sum(count for path, count in built.items() if path in TRIAL_PATH)
    return [
        f"Plan.from_json call sites: {sum(rebuilt.values())}: "
        + ", ".join(f"{path} {count}" for path, count in sorted(rebuilt.items())),
        f"build_plan calls per trial ({', '.join(TRIAL_PATH)}): {per_trial}; every call site: "
        + ", ".join(f"{path} {count}" for path, count in sorted(built.items())),
    ]


# ------------------------------------------------------------------------------ modules and words

LONG = 400


def lines_of(tree: Tree, path: str) -> int:
    return len(git("show", f"{tree.rev}:{path}").splitlines())


def long_modules(tree: Tree) -> list[str]:
    sizes = sorted(((lines_of(tree, path), short(path)) for path in tree.modules), reverse=True)
    over = [f"{path} {lines}" for lines, path in sizes if lines > LONG]
    return [f"modules over {LONG} lines: {len(over)}: {', '.join(over)}"]


def homes(tree: Tree, word: str) -> list[str]:
    """The modules named by `word` (its plural too), or inside a folder so named, and their packages."""
    named = re.compile(rf"(^|_){word}s?(_|$)")
    paths = sorted(
        short(path) for path in tree.modules if any(named.search(Path(part).stem) for part in short(path).split("/"))
    )
    packages = sorted({path.split("/")[0] if "/" in path else path for path in paths})
    return [f'homes of "{word}": {len(paths)} modules in {len(packages)} packages: {", ".join(paths)}']


# ------------------------------------------------------------------------------ what only the tests use

TESTS_HOME = f"{PACKAGE}/testing/"
SWITCH = f"{PACKAGE}/for_tests.py"  # the one switch the product reaches the tests' package through, counted whole
# What only the tests use, as main 5bb2cda held it in the product's modules: whole modules, and definitions by name.
TEST_ONLY_MODULES = ("search/faults.py", "study/moments.py", "strategy/replay.py")
TEST_ONLY_NAMES = frozenset(
    {
        "STALL_S",
        "MODEL_FAULTS",
        "DRIFT_SCALE",
        "RUNAWAY_SPANS",
        "plant_model_fault",
        "_runaway_hook",
        "_said_twice",
        "inject_fault",
        "_injects_at",
    }
)
# A line that reaches them: names a task's fault (as a name, an attribute or a key), the moments, or the tests' switch.
REACHING = frozenset(
    {"fault", "kill_server", "moments", "reach", "reach_once_connected", "injected_fault", "for_tests"}
)


def _definition_lines(module: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(module):
        named = None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            named = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            named = node.targets[0].id
        if named in TEST_ONLY_NAMES:
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            lines |= set(range(start, (node.end_lineno or node.lineno) + 1))
    return lines


def _reaching_lines(module: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(module):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is None and isinstance(node, ast.alias):
            name = node.asname or node.name.rsplit(".", 1)[-1]
        if name is None and isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
        if (
            name in REACHING
            or name in TEST_ONLY_NAMES
            or (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "fault")
        ):
            lines.add(node.lineno)
    return lines


def test_only(tree: Tree) -> list[str]:
    whole = {f"{PACKAGE}/{path}" for path in TEST_ONLY_MODULES}
    defined: Counter[str] = Counter()
    reaching: Counter[str] = Counter()
    for path, module in tree.modules.items():
        if path.startswith(TESTS_HOME):
            continue
        if path in whole or path == SWITCH:
            defined[short(path)] = lines_of(tree, path)
            continue
        definitions = _definition_lines(module)
        if definitions:
            defined[short(path)] = len(definitions)
        if calls := _reaching_lines(module) - definitions:
            reaching[short(path)] = len(calls)
    total = sum(defined.values()) + sum(reaching.values())
    return [
        f"test-only lines in product modules: {total}: what only the tests use {sum(defined.values())} ("
        + ", ".join(f"{path} {count}" for path, count in sorted(defined.items()))
        + f"), lines that reach it {sum(reaching.values())} in {len(reaching)} modules ("
        + ", ".join(f"{path} {count}" for path, count in sorted(reaching.items()))
        + ")"
    ]


def kind_exercise(span: str) -> list[str]:
    paths = git("diff", "--name-only", span, "--", PACKAGE).split()
    packages = sorted({path.split("/")[1] if path.count("/") > 1 else short(path) for path in paths})
    return [
        f"files of the package touched to add a kind like serve ({span}): {len(paths)} in {len(packages)} packages "
        f"({', '.join(packages)}): {', '.join(short(path) for path in paths)}"
    ]


def knob_exercise(span: str) -> list[str]:
    every = git("diff", "--name-only", span).split()
    package = [path for path in every if path.startswith(f"{PACKAGE}/")]
    return [
        f"files touched to add a knob of a new vocabulary, or a value of one ({span}): {len(every)}, {len(package)} "
        "of the package: "
        + ", ".join(short(path) for path in package)
        + "; the others: "
        + ", ".join(path for path in every if path not in package)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", default="HEAD")
    parser.add_argument("--kind-exercise", metavar="BASE..BRANCH", help="the branch of the exercise of adding a kind")
    parser.add_argument("--knob-exercise", metavar="BASE..BRANCH", help="a branch adding a knob of a new vocabulary")
    args = parser.parse_args()
    tree = Tree(args.rev)
    print(f"at {git('rev-parse', '--short', args.rev).strip()}:")
    lines = [*boundary(tree), *slo(tree), *terms(tree), *older_forms(tree), *search_package(tree)]
    lines += benchmarks_importing_tests(args.rev)
    lines += [*plans(tree), *long_modules(tree), *homes(tree, "ceiling"), *homes(tree, "capacity"), *test_only(tree)]
    if args.kind_exercise:
        lines += kind_exercise(args.kind_exercise)
    if args.knob_exercise:
        lines += knob_exercise(args.knob_exercise)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
