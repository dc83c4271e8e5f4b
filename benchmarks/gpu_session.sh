#!/usr/bin/env bash
# A GPU session with no network: bash benchmarks/gpu_session.sh PHASE [BUDGET], from the repo root, with
# .gpukit/ (wheels and the demo model, built by ../shared/tools/gpukit/make-kit.sh --with-plotly) carried.
# Installs the wheels into the machine's own python, records versions, runs benchmarks/gpu/gpu_proof.py and
# leaves SUMMARY.md, the log and a tarball of the proof folder under $OUT.
# PHASE: demo | llama | resume-llama | conformance | quant | headroom | settings | eight-b | quality | quality-caches |
# loops | fork-preload | traffic.
# Each phase is self-contained: a fresh machine forgets everything.
# Every phase first records `autotune gpus` (what autotune detects on the card) in $OUT/gpus.txt.
# conformance: benchmarks/conformance/conformance.py for the card's profile, every value it does not prune (BUDGET:
# per case), its table written case by case to $OUT/conformance-<profile>.md.
# headroom: the 1.1B Llama at batch 1 and 8: `autotune ceiling` (the hand-written loop) and `autotune measure`
# of static cache + compile reduce-overhead, set against each other by benchmarks/gpu/headroom.py; then (unless
# BUDGET is lean) benchmarks/decode/timer_check.py (autotune's clock, the synchronizing clock it replaced, and a plain
# generate() timed only around the call).
# quality: benchmarks/quality/quality_paths.py on the 1.1B Llama (cut on an H100 after two rows: README of
# reports/gpu/2026-11-27-h100): float32, bfloat16, compile
# reduce-overhead (CUDA graphs) and continuous batching, each figure on the prefill and on the decoding path;
# quality-caches: the same for the static cache compiled or not, the offloaded and the quantized caches.
# quant: conformance of the torchao, optimum-quanto and hqq values (the kit built with --with-quant), BUDGET per case.
# eight-b: a model of Llama-3-8B's shape (random weights, bf16), a capacity search of BUDGET (batch 1-64 within
# itl_p95<=30ms), then the hand loop at batch 1 and 8 stored with that study ($OUT/llama-8b.db).
# loops (issue 59): per decoding loop (decode_loop), the decode step against the hand loop at batch 1 and 8, bf16,
# static cache, compile reduce-overhead, paired in one process, device-timed (CUDA events), with the host reads per token
# (benchmarks/decode/decode_profile.py: hand, generate, autotune, autotune+deferred-stop, autotune+fused-step); BUDGET:
# 1b, 8b or both (the 1.1B first; the 8B shape's random bf16 weights: its tokens mean little). About 3 compiles per
# batch (the hand loop's, generate()'s forward shared by three ways, the fused step's): each run cut at 170 s.
# fork-preload (seconds): whether importing what a trial imports before its memory baseline (FIRST_CALL_MODULES:
# torchao, scipy, the quantizers) leaves CUDA untouched in the fork server on a CUDA build of torch: it did not on an
# H100 (reports/gpu/2026-11-27-h100), so the server preloads them on a CPU build only (docs/measurement.md).
# traffic (issue 68): the 1.1B Llama on the demo trace's first 16 requests, bf16: generate() with a static cache
# compiled reduce-overhead, generate() with a dynamic cache, continuous batching; goodput, wasted steps and latency
# percentiles of each (benchmarks/traffic/replays_table.py), about 3 x 1-3 minutes.
# settings: the same model at batch 1 (not run on a GPU yet; about 7 minutes, estimated):
# benchmarks/decode/generate_settings.py (what each setting transformers offers does to the decode step,
# reduce-overhead) and benchmarks/decode/decode_profile.py (generate()'s step against the hand loop's under
# torch.profiler, host side).
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
  python3 benchmarks/gpu/gpu_proof.py --model "$1" --device cuda --out "$2" --budget "$3" 2>&1 | tee "$OUT/$(basename "$2").log"
  cp "$2/SUMMARY.md" "$OUT/$(basename "$2")-SUMMARY.md" 2>/dev/null
  tar czf "$OUT/$(basename "$2").tgz" -C "$(dirname "$2")" "$(basename "$2")"
}
case $P in
  demo) proof demo /tmp/proof-demo "$B" ;;
  llama) proof llama-1b /tmp/proof-llama-1b "$B" ;;
  conformance)
    profile=$(python3 -c "from autotune.profiles import resolve_hardware as r; print(r('auto', None).profile.name)")
    python3 benchmarks/conformance/conformance.py --gpu "$profile" --timeout "$B" --table "$OUT/conformance-$profile.md" 2>&1 \
      | tee "$OUT/conformance-$profile.log" ;;
  headroom)  # the headline first (ceiling and measure), the timer cross-check last; logs go to stdout (8 files come back)
    folder=$(python3 benchmarks/gpu/llama_1b.py --device cuda | tail -1)
    timeout 150 python3 -m autotune ceiling --model "$folder" --device cuda --batch-size 1 --batch-size 8 --json \
      >"$OUT/ceiling.json"
    for b in 1 8; do
      kind=throughput; [ "$b" = 1 ] && kind=latency
      timeout 100 python3 -m autotune measure --model "$folder" --device cuda --workload $kind --batch-size $b --json \
        --set dtype=bfloat16 --set cache_implementation=static --set compile=reduce-overhead >"$OUT/measure-b$b.json"
    done
    python3 benchmarks/gpu/headroom.py "$OUT"
    [ "$B" = lean ] || for b in 1 8; do
      python3 benchmarks/decode/timer_check.py --model "$folder" --device cuda --batch-size $b --rounds 10 2>&1
    done ;;
  quant)  # the quantization packages' values (torchao, optimum-quanto, hqq) on the card's profile, BUDGET per case
    profile=$(python3 -c "from autotune.profiles import resolve_hardware as r; print(r('auto', None).profile.name)")
    cases=(); for c in torchao-int8 torchao-int4 torchao-fp8 quanto-int8 quanto-int4 quanto-float8; do cases+=(--case "quantization=$c"); done
    cases+=(--case kv_cache_backend=quanto --case kv_cache_backend=hqq)
    python3 benchmarks/conformance/conformance.py --gpu "$profile" --timeout "$B" "${cases[@]}" --table "$OUT/conformance-$profile-quant.md" 2>&1 ;;
  quality)  # issue 46 on the 1.1B Llama: the prefill figure against the decoding path's, CUDA graphs and batching
    folder=$(python3 benchmarks/gpu/llama_1b.py --device cuda | tail -1)
    python3 benchmarks/quality/quality_paths.py --device cuda --model "$folder" --out "$OUT/quality-paths-cuda.md" \
      --only float32 --only bfloat16 --only "static cache, compile reduce-overhead" --only continuous 2>&1 ;;
  quality-caches)  # the same table for the other caches
    folder=$(python3 benchmarks/gpu/llama_1b.py --device cuda | tail -1)
    python3 benchmarks/quality/quality_paths.py --device cuda --model "$folder" --out "$OUT/quality-paths-cuda-caches.md" \
      --only "static cache, compile off" --only "static cache, compile default" --only offloaded --only "quantized cache" 2>&1 ;;
  eight-b)  # Llama-3-8B's shape, random weights: a capacity search within a per-token target, then the hand loop
    out=/tmp/llama-8b; [ "$(df --output=avail -k /dev/shm | tail -1)" -gt 40000000 ] && out=/dev/shm/llama-8b  # 16 GB
    folder=$(timeout 240 python3 benchmarks/gpu/llama_1b.py --device cuda --shape 8b --train-steps 0 --out $out | tail -1)
    df -h /dev/shm /tmp; ls -la "$folder"
    # the hand loop first, on its own (a search cut by the call's limit leaves it measured); its figures are stored with
    # the study afterwards (autotune.study.ceilings.store_ceilings)
    timeout 150 python3 -m autotune ceiling --model "$folder" --device cuda --batch-size 1 --batch-size 8 --json \
      >"$OUT/ceiling-8b.json"
    timeout 420 python3 -m autotune search --model "$folder" --device cuda --gpu auto --study llama-8b \
      --storage "sqlite:///$OUT/llama-8b.db" --batch-size 1-64 --slo "itl_p95<=30ms" --budget "$B" \
      --report /tmp/llama-8b.html 2>&1 | tee "$OUT/search-8b.log" ;;
  settings)
    folder=$(python3 benchmarks/gpu/llama_1b.py --device cuda 2>"$OUT/build.log" | tail -1)
    python3 benchmarks/decode/generate_settings.py --model "$folder" --device cuda --dtype bfloat16 --mode reduce-overhead \
      --batch-size 1 --rounds 10 2>&1 | tee "$OUT/settings-b1.log"
    python3 benchmarks/decode/decode_profile.py --model "$folder" --device cuda --dtype bfloat16 --compile reduce-overhead \
      --batch-size 1 --calls 3 --paired 10 --top 40 2>&1 | tee "$OUT/profile-b1.log" ;;
  loops)
    shapes=(1b 8b); [ "$B" = 1b ] && shapes=(1b); [ "$B" = 8b ] && shapes=(8b)
    for shape in "${shapes[@]}"; do
      if [ "$shape" = 8b ]; then
        folder=$(timeout 240 python3 benchmarks/gpu/llama_1b.py --device cuda --shape 8b --train-steps 0 --out /tmp/llama-8b | tail -1)
      else
        folder=$(python3 benchmarks/gpu/llama_1b.py --device cuda 2>"$OUT/build.log" | tail -1)
      fi
      for b in 1 8; do
        timeout 170 python3 benchmarks/decode/decode_profile.py --model "$folder" --device cuda --dtype bfloat16 \
          --compile reduce-overhead --batch-size $b --calls 1 --paired 5 --top 25 2>&1 | tee "$OUT/loops-$shape-b$b.log"
      done
    done ;;
  fork-preload)
    python3 - <<'PY' 2>&1 | tee "$OUT/fork-preload.txt"
import time
from autotune.worker import forkserver
from autotune.worker.loading import FIRST_CALL_MODULES, import_first_call_modules
forkserver._preload()
before = forkserver.unsafe_to_fork()
started = time.perf_counter()
import_first_call_modules()
print(f"first-call modules {FIRST_CALL_MODULES}: imported in {time.perf_counter() - started:.2f} s; "
      f"unsafe to fork before: {before}; after: {forkserver.unsafe_to_fork()}")
PY
    ;;
  traffic)  # issue 68 on a GPU: the 1.1B Llama replaying the demo trace's first 16 requests, per configuration
    folder=$(python3 benchmarks/gpu/llama_1b.py --device cuda 2>"$OUT/build.log" | tail -1)
    for name in generate-static-compiled generate-dynamic continuous; do
      case $name in
        generate-static-compiled) knobs=(--set cache_implementation=static --set compile=reduce-overhead) ;;
        generate-dynamic) knobs=(--set cache_implementation=dynamic) ;;
        continuous) knobs=(--set batching=continuous) ;;
      esac
      timeout 170 python3 -m autotune measure --model "$folder" --device cuda --set dtype=bfloat16 "${knobs[@]}" \
        --traffic demo --traffic-requests 16 --json >"$OUT/traffic-$name.json" 2>"$OUT/traffic-$name.log"
    done
    python3 benchmarks/traffic/replays_table.py "$OUT"/traffic-*.json 2>&1 | tee "$OUT/traffic.md" ;;
  resume-llama) mkdir -p /tmp/proof-llama-1b && tar xzf reports/gpu/incoming/proof-llama-1b.tgz -C /tmp && proof llama-1b /tmp/proof-llama-1b "$B" ;;
  *) echo "unknown phase $P" >&2; exit 2 ;;
esac
