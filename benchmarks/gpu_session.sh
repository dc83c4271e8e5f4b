#!/usr/bin/env bash
# A GPU session with no network: bash benchmarks/gpu_session.sh PHASE [BUDGET], from the repo root, with
# .gpukit/ (wheels and the demo model, built by ../shared/tools/gpukit/make-kit.sh --with-plotly) carried.
# Installs the wheels into the machine's own python, records versions, runs benchmarks/gpu_proof.py and
# leaves SUMMARY.md, the log and a tarball of the proof folder under $OUT.
# PHASE: demo | llama | resume-llama | conformance.  Each phase is self-contained: a fresh machine forgets everything.
# Every phase first records `autotune gpus` (what autotune detects on the card) in $OUT/gpus.txt.
# conformance: benchmarks/conformance.py for the card's profile, every value it does not prune (BUDGET: per case),
# its table written case by case to $OUT/conformance-<profile>.md.
set -uo pipefail
K=.gpukit; P=${1:?phase}; B=${2:-5m}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false AUTOTUNE_CACHE_DIR=/tmp/atcache PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $AUTOTUNE_CACHE_DIR/models
for m in $K/cache/models/*; do [ -d "$AUTOTUNE_CACHE_DIR/models/$(basename "$m")" ] || cp -r "$m" $AUTOTUNE_CACHE_DIR/models/; done
if ! python3 -c "import optuna, bitsandbytes, plotly" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile $K/whl/*.whl || exit 1
fi
python3 - <<'PY' 2>&1 | tee -a "$OUT/versions.txt"
import torch, transformers, bitsandbytes, optuna, plotly
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__,
      "bitsandbytes", bitsandbytes.__version__, "optuna", optuna.__version__, "plotly", plotly.__version__,
      "gpu", torch.cuda.get_device_name())
PY
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$OUT/versions.txt"
python3 -m autotune gpus 2>&1 | tee "$OUT/gpus.txt"
proof() {  # proof MODEL DIR BUDGET
  python3 benchmarks/gpu_proof.py --model "$1" --device cuda --out "$2" --budget "$3" 2>&1 | tee "$OUT/$(basename "$2").log"
  cp "$2/SUMMARY.md" "$OUT/$(basename "$2")-SUMMARY.md" 2>/dev/null
  tar czf "$OUT/$(basename "$2").tgz" -C "$(dirname "$2")" "$(basename "$2")"
}
case $P in
  demo) proof demo /tmp/proof-demo "$B" ;;
  llama) proof llama-1b /tmp/proof-llama-1b "$B" ;;
  conformance)
    profile=$(python3 -c "from autotune.profiles import resolve_hardware as r; print(r('auto', None).profile.name)")
    python3 benchmarks/conformance.py --gpu "$profile" --timeout "$B" --table "$OUT/conformance-$profile.md" 2>&1 \
      | tee "$OUT/conformance-$profile.log" ;;
  resume-llama) mkdir -p /tmp/proof-llama-1b && tar xzf reports/gpu/incoming/proof-llama-1b.tgz -C /tmp && proof llama-1b /tmp/proof-llama-1b "$B" ;;
  *) echo "unknown phase $P" >&2; exit 2 ;;
esac
