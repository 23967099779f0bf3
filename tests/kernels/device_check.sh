#!/usr/bin/env bash
# Everything the kernels need a GPU for, in one call (a machine with no nox: python3 + pytest):
# build drafter_lab._C for this GPU, the GPU correctness suites, the benchmarks, compute-sanitizer.
#   OUT=DIR bash tests/kernels/device_check.sh [build] [tests] [allreduce] [bench] [sanitizer]   (default: all)
# bench is breakdown, table, gemv, verify and replay, which can also be named alone (to order a short
# call by priority); ALLREDUCE_BLOCKS (default "16 4 1") sets the all-reduce runs' CTA counts.
# Each step has its own time limit and the script goes on after a failure, so one call shows every
# problem; the log (device_check.log) and the benchmark JSON land in $OUT, and
# the last lines printed are the summary. The limits add up to more than one 600 s device call:
# where a call must be shorter, run `build tests allreduce` first (a warm machine keeps the build).
set -uo pipefail
# A relative OUT (or PYTHON path) names a place from where this was called, not from the checkout.
if [[ -n ${OUT:-} && $OUT != /* ]]; then OUT="$PWD/$OUT"; fi
if [[ ${PYTHON:-} == */* && $PYTHON != /* ]]; then PYTHON="$PWD/$PYTHON"; fi
cd "$(dirname "$0")/../.."
export OUT="${OUT:-runs/device}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
KNOWN="build tests allreduce breakdown table gemv verify replay sanitizer"
read -r -a NAMED <<<"${*:-build tests allreduce bench sanitizer}"
STEPS=()
for s in "${NAMED[@]}"; do
  [[ $s == bench ]] && STEPS+=(breakdown table gemv verify replay) && continue
  # every name is checked before anything runs: a typo must not cost the steps before it
  [[ " $KNOWN " == *" $s "* ]] || { echo "unknown step: $s (build, tests, allreduce, bench = breakdown table gemv verify replay, sanitizer)"; exit 2; }
  STEPS+=("$s")
done
summary=()

step() {  # step NAME LIMIT_S CMD...: run with a limit, log to $OUT/NAME.log, record rc and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  echo "== ${name} (limit ${limit}s): $*"
  local log="$OUT/${name}.log"
  timeout --kill-after=5 "${limit}" "$@" >"$log" 2>&1
  rc=$?
  tail -n 25 "$log"
  { echo "===== ${name} rc=${rc}: $*"; cat "$log"; } >>"$OUT/device_check.log" && rm -f "$log"
  summary+=("$(printf '%-22s rc=%-3s %4ss' "${name}" "${rc}" "$((SECONDS - t0))")")
}

for s in "${STEPS[@]}"; do
  case "$s" in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
      "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
      # Only this GPU's architecture: the full list (setup.py's default) is for wheels and images, and a
      # fixed one leaves any other GPU without a kernel it can load. 9.0 where no GPU answers.
      arch="${TORCH_CUDA_ARCH_LIST:-}"
      if [[ -z $arch ]]; then
        arch=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null)
        [[ $arch =~ ^[0-9]+\.[0-9]+$ ]] || arch=9.0
      fi
      echo "building for TORCH_CUDA_ARCH_LIST=${arch}"
      step build 240 env TORCH_CUDA_ARCH_LIST="${arch}" MAX_JOBS="${MAX_JOBS:-16}" \
        "$PY" setup.py -q build_ext --inplace
      ;;
    tests)
      step tests 240 "$PY" -m pytest tests/kernels tests/spec/test_fused_decoding.py tests/spec/test_ngram.py tests/spec/test_phases.py \
        tests/train/test_bench_replay.py tests/train/test_train_cuda.py -m gpu -q -p no:cacheprovider --timeout=90 -rfEs \
        --durations=12
      ;;
    breakdown)
      # Per-kernel device times with and without programmatic dependent launch.
      for pdl in 1 0; do
        step "breakdown_pdl${pdl}" 90 env DRAFTER_LAB_PDL=$pdl "$PY" -m drafter_lab.kernels.bench_draft_forward \
          --breakdown --compile-mode none --batch 1 8 --reps 50
      done
      ;;
    table)
      step bench_draft_forward 150 "$PY" -m drafter_lab.kernels.bench_draft_forward \
        --json "$OUT/draft_forward.json" --markdown "$OUT/draft_forward.md" --reps "${BENCH_REPS:-100}"
      ;;
    gemv)
      # GEMV occupancy A/B against the table's "ours" (gemv.cu, blocks_per_sm): four blocks per SM fill
      # the register file, so a kernel's successor only becomes resident in its tail; three leave it one
      # block's room, two leave it half the SM.
      for blocks in 3 2; do
        step "gemv_blocks${blocks}" 90 env DRAFTER_LAB_GEMV_BLOCKS=$blocks "$PY" -m drafter_lab.kernels.bench_draft_forward \
          --compile-mode none --batch 1 8 --reps "${BENCH_REPS:-100}"
      done
      ;;
    verify)
      # The target's verify pass by batch and tokens on this GPU (a random Llama-3.2-1B-shaped body).
      target_dir=$(mktemp -d)
      step random_target 120 "$PY" tests/kernels/random_target.py "$target_dir"
      step bench_verify 120 "$PY" -m drafter_lab.spec.bench_verify --target "$target_dir" --dtype bfloat16 \
        --tokens 1,2,4,8,16,32 --batch 1,8,32 --context 1024 --json "$OUT/verify.json"
      rm -rf "$target_dir"
      ;;
    replay)
      # Validation's replay solve: blocks against the position loop (launch-bound on a GPU).
      step bench_replay 60 "$PY" -m drafter_lab.train.bench_replay --device cuda
      ;;
    allreduce)
      # Every algorithm (LL, one-shot, two-shot) of both CUDA backends, ranks as streams of one GPU.
      for blocks in ${ALLREDUCE_BLOCKS:-16 4 1}; do
        step "bench_allreduce_${blocks}ctas" 90 "$PY" -m drafter_lab.kernels.bench_allreduce --gpu-streams \
          --blocks "$blocks" --sizes 1024 8192 32768 57344 65536 262144 1048576 --json "$OUT/allreduce.json"
      done
      ;;
    sanitizer)
      step sanitizer 150 bash tests/kernels/run_sanitizer.sh
      ;;
  esac
done
echo "== summary"
printf '%s\n' "${summary[@]}"
