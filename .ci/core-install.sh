#!/usr/bin/env bash
# autotune installed as users install it, not as make's venv with every extra:
#  1. a clean venv with torch and `pip install .` (no extra, no -e) runs search, measure, worker on SQLite,
#     report, best, compare and gpus from an empty folder, and a feature behind an extra (the serve workload,
#     a PostgreSQL storage, a torchao value) is refused in one line naming the extra, exit 2, nothing written;
#     a torchao value of the default space is left out of the search with that line as its reason;
#  2. the wheel of `pip wheel .` holds exactly what `pip install .` installed there (the same files, byte for byte,
#     and the same metadata: dependencies, extras, entry points), so installing it runs what ran in 1;
#  3. the sdist holds what the wheel holds (a wheel built from it has the same files).
# Usage: .ci/core-install.sh [prepare|check]   (PYTHON=python3 TORCH=torch==2.13.0 by default)
#   prepare: copy the tree, build the wheel and the sdist, install the clean venv (disk and network, little CPU);
#   check: run the commands in them. Without a phase, both. Split, the two phases share CORE_INSTALL_WORK, a folder
#   that check removes at its end; .ci/run prepares while the tests run.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
torch="${TORCH:-torch==2.13.0}"
phase="${1:-all}"
work="${CORE_INSTALL_WORK:-}"
if [ -z "$work" ]; then
  [ "$phase" = all ] || { echo "core-install: $phase needs CORE_INSTALL_WORK (the folder both phases share)" >&2; exit 2; }
  work="$(mktemp -d)"
fi
[ "$phase" = prepare ] || trap 'rm -rf "$work"' EXIT
export AUTOTUNE_CACHE_DIR="${AUTOTUNE_CACHE_DIR:-$work/cache}"  # the demo model: the tests' when .ci/run gives it
small=(--batch-size 2 --input-len 16 --output-len 8 --min-seconds 0.2)  # figures of 0.2 s of timing: what runs is checked

fail() { echo "core-install: FAILED: $*" >&2; exit 1; }

prepare() {
  # The working tree as a clone has it (tracked and new files, nothing ignored), so no build/ is left in it.
  mkdir "$work/src"
  git -C "$repo" ls-files -z --cached --others --exclude-standard |
    (cd "$repo" && xargs -0 sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' sh) |
    tar -C "$repo" --null -T - -cf - | tar -C "$work/src" -xf -
  new_venv "$work/core" .
  (cd "$work/src" && "$work/core/bin/python" -m pip wheel -q --no-deps . -w "$work/dist" 2>&1 | quiet)
  "$work/core/bin/python" -m pip install -q build 2>&1 | quiet
  "$work/core/bin/python" -m build --sdist --outdir "$work/sdist" "$work/src" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log"; fail "the sdist could not be built"; }
  "$work/core/bin/python" -m pip wheel -q --no-deps "$work"/sdist/autotune-*.tar.gz -w "$work/sdist-wheel" 2>&1 | quiet
  touch "$work/prepared"
}

quiet() { grep -v "^WARNING: Location" || true; }

new_venv() {  # a clean venv with torch and the given autotune (a folder or a wheel), no extra
  "$python" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
  "$1/bin/python" -m pip install -q "$torch" 2>&1 | quiet
  (cd "$work/src" && "$1/bin/python" -m pip install -q "$2" 2>&1 | quiet)
  "$1/bin/autotune" --help >/dev/null || fail "autotune is not installed in $1"
}

run() {  # print the command, then its output; stop at a failure
  echo "\$ autotune $*"
  "$bin/autotune" "$@" || fail "autotune $* exited with $?"
  echo
}

refused() {  # the command must end with one line on stderr naming the extra, exit 2, nothing written
  local expected="$1"
  shift
  local folder="$work/refused" status=0
  rm -rf "$folder" && mkdir "$folder"
  echo "\$ autotune $*"
  (cd "$folder" && "$bin/autotune" "$@" >"$work/stdout" 2>"$work/stderr") || status=$?
  cat "$work/stderr"
  [ "$status" = 2 ] || fail "exit status $status, not 2"
  [ "$(wc -l <"$work/stderr")" = 1 ] || fail "stderr is not one line"
  grep -qF "$expected" "$work/stderr" || fail "stderr does not say $expected"
  [ -z "$(ls -A "$folder")" ] || fail "it wrote $(ls -A "$folder")"
  echo "(exit 2, nothing written)"
  echo
}

check() {
  [ -f "$work/prepared" ] || fail "nothing prepared in $work (run the prepare phase first)"
  echo "== core install: $torch, then pip install . (no extra)"
  bin="$work/core/bin"
  mkdir "$work/run" && cd "$work/run"
  run search --model demo --trials 3 "${small[@]}" | tee "$work/search.log"
  grep -qF 'quantization=torchao-int8' "$work/search.log" && grep -qF 'pip install "autotune[quant]"' "$work/search.log" ||
    fail "the search did not say why the torchao values were left out"
  run measure --model demo --device cpu --set dtype=float32 --traffic demo --traffic-requests 8 --batch-size 2 \
    --min-seconds 0.2 | tee "$work/measure.log"  # the bundled trace, as README shows it, from the installed package
  grep -qF 'the first 8 of 48 requests of demo-trace.jsonl' "$work/measure.log" && grep -qF 'requests_served: 8' \
    "$work/measure.log" || fail "measure --traffic demo did not replay the bundled trace's first 8 requests"
  run worker --study demo-cpu --storage sqlite:///studies/demo-cpu.db --trials 1
  run report --study demo-cpu
  run best --study demo-cpu
  run compare demo-cpu demo-cpu
  run gpus
  refused 'pip install "autotune[serve]"' search --model demo --trials 1 --workload serve
  refused 'pip install "autotune[postgres]"' search --model demo --trials 1 --storage postgresql+psycopg://tuner@localhost/studies
  refused 'pip install "autotune[quant]"' measure --model demo --set quantization=torchao-int8 "${small[@]}"

  echo "== wheel: pip wheel . holds what pip install . installed above"
  # A second clean venv with the wheel installed ran a demo search again (about 110 s of CPU, most of it pip installing
  # torch and transformers once more): the same files with the same metadata show the same thing.
  "$bin/python" - "$(ls "$work"/dist/autotune-*.whl)" <<'PYTHON' || fail "the wheel differs from what pip install . installed"
import sys, zipfile
from importlib.metadata import distribution

wheel = zipfile.ZipFile(sys.argv[1])
installed = distribution("autotune")
site = installed.locate_file("")
written_by_pip = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # each install writes its own


def compared(name: str) -> bool:
    folder, _, file = name.rpartition("/")
    return "__pycache__" not in name and not (folder.endswith(".dist-info") and file in written_by_pip)


in_wheel = {name for name in wheel.namelist() if compared(name)}
here = {str(path) for path in installed.files or [] if compared(str(path)) and not str(path).startswith("..")}
problems = [f"only in the wheel: {name}" for name in sorted(in_wheel - here)]
problems += [f"only installed: {name}" for name in sorted(here - in_wheel)]
problems += [f"missing: {name}" for name in sorted(in_wheel & here) if not (site / name).is_file()]
problems += [f"differs: {name}" for name in sorted(in_wheel & here) if (site / name).is_file() and
             wheel.read(name) != (site / name).read_bytes()]
print("\n".join(problems) or f"{len(in_wheel)} files, byte for byte, metadata included (dependencies, extras, entry points)")
sys.exit(1 if problems else 0)
PYTHON
  echo

  echo "== sdist: a wheel built from it holds the same files"
  local wheel sdist files
  wheel="$(ls "$work"/dist/autotune-*.whl)"
  sdist="$(ls "$work"/sdist/autotune-*.tar.gz)"
  listing() { "$work/core/bin/python" -c "import sys, zipfile; print('\n'.join(sorted(zipfile.ZipFile(sys.argv[1]).namelist())))" "$1"; }
  files="$(listing "$wheel")"
  [ "$files" = "$(listing "$(ls "$work"/sdist-wheel/autotune-*.whl)")" ] || fail "the sdist's wheel holds other files"
  for data in autotune/space/default.yaml autotune/data/corpus.txt autotune/data/eval.txt autotune/data/prompts.jsonl \
    autotune/data/demo-trace.jsonl; do
    grep -qx "$data" <<<"$files" || fail "$data is not in the wheel"
  done
  echo "$(basename "$sdist") and $(basename "$wheel"): the same $(wc -l <<<"$files") files, package data included"
  echo "core-install: ok"
}

case "$phase" in
  prepare) prepare ;;
  check) check ;;
  all) prepare && check ;;
  *) echo "core-install: unknown phase $phase (prepare, check, or none for both)" >&2; exit 2 ;;
esac
