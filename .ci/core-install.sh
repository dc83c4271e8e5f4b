#!/usr/bin/env bash
# autotune installed as users install it, not as make's venv with every extra:
#  1. a clean venv with torch and `pip install .` (no extra, no -e) runs search, measure, worker on SQLite,
#     report, best, compare and gpus from an empty folder, and a feature behind an extra (the serve workload,
#     a PostgreSQL storage, a torchao value) is refused in one line naming the extra, exit 2, nothing written;
#     a torchao value of the default space is left out of the search with that line as its reason;
#  2. `pip wheel .` installed into another clean venv runs a demo search from an empty folder;
#  3. the sdist holds what the wheel holds (a wheel built from it has the same files).
# Usage: .ci/core-install.sh   (PYTHON=python3 TORCH=torch==2.13.0 by default)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
torch="${TORCH:-torch==2.13.0}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export AUTOTUNE_CACHE_DIR="${AUTOTUNE_CACHE_DIR:-$work/cache}"  # the demo model is built once, for both venvs
small=(--batch-size 2 --input-len 16 --output-len 8)

fail() { echo "core-install: FAILED: $*" >&2; exit 1; }

# The working tree as a clone has it (tracked and new files, nothing ignored), so no build/ is left in it.
mkdir "$work/src"
git -C "$repo" ls-files -z --cached --others --exclude-standard |
  (cd "$repo" && xargs -0 sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' sh) |
  tar -C "$repo" --null -T - -cf - | tar -C "$work/src" -xf -

new_venv() {  # a clean venv with torch and the given autotune (a folder or a wheel), no extra
  "$python" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  "$1/bin/python" -m pip install -q "$torch" 2>&1 | grep -v "^WARNING: Location" || true
  (cd "$work/src" && "$1/bin/python" -m pip install -q "$2" 2>&1 | grep -v "^WARNING: Location" || true)
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

echo "== core install: $torch, then pip install . (no extra)"
new_venv "$work/core" .
bin="$work/core/bin"
mkdir "$work/run" && cd "$work/run"
run search --model demo --trials 3 "${small[@]}" | tee "$work/search.log"
grep -qF 'quantization=torchao-int8' "$work/search.log" && grep -qF 'pip install "autotune[quant]"' "$work/search.log" ||
  fail "the search did not say why the torchao values were left out"
run measure --model demo --device cpu --set dtype=float32 "${small[@]}"
run worker --study demo-cpu --storage sqlite:///studies/demo-cpu.db --trials 1
run report --study demo-cpu
run best --study demo-cpu
run compare demo-cpu demo-cpu
run gpus
refused 'pip install "autotune[serve]"' search --model demo --trials 1 --workload serve
refused 'pip install "autotune[postgres]"' search --model demo --trials 1 --storage postgresql+psycopg://tuner@localhost/studies
refused 'pip install "autotune[quant]"' measure --model demo --set quantization=torchao-int8 "${small[@]}"

echo "== wheel: pip wheel . into another clean venv"
(cd "$work/src" && "$bin/python" -m pip wheel -q --no-deps . -w "$work/dist" 2>&1 | grep -v "^WARNING: Location" || true)
wheel="$(ls "$work"/dist/autotune-*.whl)"
new_venv "$work/wheel" "$wheel"
bin="$work/wheel/bin"
mkdir "$work/run-wheel" && cd "$work/run-wheel"
run search --model demo --trials 3 "${small[@]}"

echo "== sdist: a wheel built from it holds the same files"
"$work/core/bin/python" -m pip install -q build 2>&1 | grep -v "^WARNING: Location" || true
"$work/core/bin/python" -m build --sdist --outdir "$work/sdist" "$work/src" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "the sdist could not be built"; }
sdist="$(ls "$work"/sdist/autotune-*.tar.gz)"
"$work/core/bin/python" -m pip wheel -q --no-deps "$sdist" -w "$work/sdist-wheel" 2>&1 | grep -v "^WARNING: Location" || true
listing() { "$work/core/bin/python" -c "import sys, zipfile; print('\n'.join(sorted(zipfile.ZipFile(sys.argv[1]).namelist())))" "$1"; }
files="$(listing "$wheel")"
[ "$files" = "$(listing "$(ls "$work"/sdist-wheel/autotune-*.whl)")" ] || fail "the sdist's wheel holds other files"
for data in autotune/spaces/default.yaml autotune/data/corpus.txt autotune/data/eval.txt autotune/data/prompts.jsonl; do
  grep -qx "$data" <<<"$files" || fail "$data is not in the wheel"
done
echo "$(basename "$sdist") and $(basename "$wheel"): the same $(wc -l <<<"$files") files, package data included"
echo "core-install: ok"
