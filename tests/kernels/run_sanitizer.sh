#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over the draft-step CUDA tests at small shapes (needs a
# GPU and drafter_lab._C built with its CUDA kernels). Exits non-zero on the first reported error.
#   bash tests/kernels/run_sanitizer.sh                 (python3 from PATH)
#   PYTHON=/path/to/python SANITIZER_ARGS="--kernel-name kns=drafter_lab" bash tests/kernels/run_sanitizer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
# Small draws on both batch paths, graph replay, the out-of-range row, opcheck: every kernel runs.
TESTS=(tests/kernels/test_draft_step.py -q -p no:cacheprovider -m gpu
       -k "test_gpu_small or test_gpu_graph_replay or nan_row or test_opcheck_cuda")
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool ${tool}"
  # shellcheck disable=SC2086
  "${SANITIZER}" --tool "${tool}" --error-exitcode 1 ${SANITIZER_ARGS:-} "${PYTHON}" -m pytest "${TESTS[@]}"
done
echo "compute-sanitizer: memcheck and racecheck clean"
