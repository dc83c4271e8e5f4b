#!/usr/bin/env bash
# One night of tuning: search tonight's study (last night's front measured first), compare it with the
# previous night, and chart every night so far. The Kubernetes CronJob (deploy/kubernetes/nightly.yaml)
# runs it; so can cron or a scheduled CI job (docs/deploy.md).
#
#   AUTOTUNE_NIGHTLY_PREFIX=qwen-a10g AUTOTUNE_SEARCH="--model Qwen/Qwen3-0.6B --gpu a10g --eval gsm8k" \
#     AUTOTUNE_GATE="recovery_low>=0.95 flips<=0.05" deploy/nightly.sh
#
# Settings, from the environment:
#   AUTOTUNE_NIGHTLY_PREFIX  the studies are PREFIX-YYYY-MM-DD (required)
#   AUTOTUNE_SEARCH          `autotune search` flags: --model, --gpu, --constraint... (required); with --eval TASK
#                            the front's finalists are evaluated on the task, and compare follows their answers
#   AUTOTUNE_GATE            `autotune best` constraints tonight's pick must meet, e.g. "recovery_low>=0.95
#                            flips<=0.05": best's pick is evaluated on the task first where the budget left it out
#                            (autotune evaluate), and the pick is written as pick.json
#   AUTOTUNE_BUDGET          tonight's budget (default 2h); AUTOTUNE_TRIALS: a number of trials instead, or too
#   AUTOTUNE_STORAGE         one storage URL for every night (default: studies/<study>.db, a file per night)
#   AUTOTUNE_ARTIFACTS       where trial logs, reports and the chart of the nights go (a folder, s3://, gs://)
#   AUTOTUNE_TOLERANCES      `compare` and `history` flags: --threshold, --memory-tolerance, --kl-tolerance (default:
#                            theirs, 5% on a GPU, 25% on a CPU for throughput)
#   AUTOTUNE_NIGHT           tonight's date, YYYY-MM-DD (default: today)
#   AUTOTUNE_GATE_BUDGET     the budget of the gate's evaluations (default 30m)
#   AUTOTUNE_OUT             folder for compare.md, history.md, history.html and pick.json (default: reports)
#   GITHUB_STEP_SUMMARY      set by GitHub Actions: the comparison and the nights' table are appended to it
#
# Exit status: 0; 3 when tonight regressed against the previous night (autotune compare's verdict), or when no
# configuration meets AUTOTUNE_GATE (autotune best's); any other status is the failing command's.

set -uo pipefail

die() { echo "nightly: error: $*" >&2; exit 2; }
[ -n "${AUTOTUNE_NIGHTLY_PREFIX:-}" ] || die "set AUTOTUNE_NIGHTLY_PREFIX (studies are PREFIX-YYYY-MM-DD)"
[ -n "${AUTOTUNE_SEARCH:-}" ] || die "set AUTOTUNE_SEARCH to the search flags (--model ... --gpu ...)"

prefix=$AUTOTUNE_NIGHTLY_PREFIX
night=${AUTOTUNE_NIGHT:-$(date +%F)}
tonight=$prefix-$night
out=${AUTOTUNE_OUT:-reports}
mkdir -p "$out"
storage=()
[ -z "${AUTOTUNE_STORAGE:-}" ] || storage=(--storage "$AUTOTUNE_STORAGE")
artifacts=()
[ -z "${AUTOTUNE_ARTIFACTS:-}" ] || artifacts=(--artifacts "$AUTOTUNE_ARTIFACTS")

# The previous night: the latest study of this prefix before tonight (a night may have been skipped).
# (none on the first night: history then finds no study and prints nothing)
previous=$(autotune history --studies "$prefix-*" "${storage[@]}" --report "$out/history.html" --format json 2>/dev/null \
  | python3 -c '
import json, sys
text = sys.stdin.read()
nights = json.loads(text)["nights"] if text.strip() else []
earlier = [night["study"] for night in nights if night["study"] < sys.argv[1]]
print(earlier[-1] if earlier else "")' "$tonight")

tolerances=()
[ -z "${AUTOTUNE_TOLERANCES:-}" ] || read -ra tolerances <<<"$AUTOTUNE_TOLERANCES"
limits=(--budget "${AUTOTUNE_BUDGET:-2h}")
[ -z "${AUTOTUNE_TRIALS:-}" ] || limits=(--trials "$AUTOTUNE_TRIALS" ${AUTOTUNE_BUDGET:+--budget "$AUTOTUNE_BUDGET"})
warm=()
[ -z "$previous" ] || warm=(--warm-start "$previous")
read -ra search <<<"$AUTOTUNE_SEARCH"
autotune search "${search[@]}" --study "$tonight" "${storage[@]}" "${artifacts[@]}" "${limits[@]}" "${warm[@]}" \
  --report "$out/$tonight.html" || exit

verdict=0
if [ -n "${AUTOTUNE_GATE:-}" ]; then  # tonight's pick must meet the gate: evaluated on the task first if need be
  gate=()
  read -ra bounds <<<"$AUTOTUNE_GATE"
  for bound in "${bounds[@]}"; do gate+=(--constraint "$bound"); done
  if [[ " $AUTOTUNE_SEARCH " == *" --eval "* ]]; then
    autotune evaluate --study "$tonight" "${storage[@]}" "${gate[@]}" --budget "${AUTOTUNE_GATE_BUDGET:-30m}"
    evaluated=$?  # 1: an evaluation failed, 3: nothing meets the gate's other bounds; best says which cut the last
    [ "$evaluated" = 0 ] || [ "$evaluated" = 1 ] || [ "$evaluated" = 3 ] || exit "$evaluated"
  fi
  rm -f "$out/pick.json"  # a pick left by an earlier night is not tonight's
  autotune best --study "$tonight" "${storage[@]}" "${gate[@]}" --format json >"$out/pick.json.partial"
  verdict=$?
  if [ "$verdict" = 0 ]; then mv "$out/pick.json.partial" "$out/pick.json"; else rm -f "$out/pick.json.partial"; fi
  [ "$verdict" = 0 ] || [ "$verdict" = 3 ] || exit "$verdict"
fi
if [ -n "$previous" ]; then
  autotune compare "$previous" "$tonight" "${storage[@]}" "${tolerances[@]}" --format markdown >"$out/compare.md"
  compared=$?
  [ "$compared" = 0 ] || [ "$compared" = 3 ] || exit "$compared"
  [ "$compared" = 0 ] || verdict=3
  cat "$out/compare.md"
fi
# The chart of every night (stored with tonight's study when AUTOTUNE_ARTIFACTS is set), and its table.
autotune history --studies "$prefix-*" "${storage[@]}" "${artifacts[@]}" "${tolerances[@]}" --report "$out/history.html" \
  --format markdown \
  >"$out/history.md" || exit
cat "$out/history.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  { [ -z "$previous" ] || cat "$out/compare.md"; echo; cat "$out/history.md"; } >>"$GITHUB_STEP_SUMMARY"
fi
exit "$verdict"
