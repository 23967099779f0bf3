#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over the draft-step CUDA tests at small shapes (needs a
# GPU and drafter_lab._C built with its CUDA kernels). Exits non-zero on the first reported error.
#   bash tests/kernels/run_sanitizer.sh                 (python3 from PATH)
#   PYTHON=/path/to/python SANITIZER_ARGS="--kernel-name kns=drafter_lab" bash tests/kernels/run_sanitizer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
# Small draws on both batch paths, graph replay, the out-of-range row, opcheck, and attention over
# several K/V tiles per block with 8 heads per kv head and top-16: every kernel and path runs.
TESTS=(tests/kernels/test_draft_step.py -q -p no:cacheprovider -m gpu
       -k "test_gpu_small or test_gpu_graph_replay or nan_row or test_opcheck_cuda or fp32-small")
# cuBLAS's own kernels (nvjet*, used above batch 16) draw racecheck reports that are not ours to
# fix (seen on an H200, 2026-11-30; --kernel-name-exclude made racecheck crash there instead), so
# the run fails on the tests failing or on any report that names another kernel.
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool ${tool}"
  log="$(mktemp)"
  # shellcheck disable=SC2086
  "${SANITIZER}" --tool "${tool}" ${SANITIZER_ARGS:-} "${PYTHON}" -m pytest "${TESTS[@]}" 2>&1 | tee "${log}"
  status=${PIPESTATUS[0]}
  ours=$(grep -E '========= +(Error|Invalid)' "${log}" | grep -vc nvjet || true)
  theirs=$(grep -E '========= +(Error|Invalid)' "${log}" | grep -c nvjet || true)
  rm -f "${log}"
  echo "compute-sanitizer ${tool}: ${ours} report(s) in our kernels, ${theirs} in cuBLAS's; pytest exit ${status}"
  if [[ ${status} -ne 0 || ${ours} -ne 0 ]]; then exit 1; fi
done
echo "compute-sanitizer: memcheck and racecheck clean"
