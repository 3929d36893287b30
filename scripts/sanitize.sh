#!/usr/bin/env bash
# The sanitizer presets over a fixed subset of the unit tests, small enough for CI's budget:
#   asan (AddressSanitizer + UBSan): the readers of foreign input and the analyses over them
#     (pickle, PyTorch and megascope dumps, the binary dump stream and the arena its entries live
#     in, hang and slowdown analysis, the detector and its CSV/Prometheus readers) and the ring;
#   tsan (ThreadSanitizer): the ring's lock-free claim/publish path, the tracer's threads and the
#     NCCL profiler plugin driven from NCCL's threads in real processes
#     (TSan does not model the seqlock's standalone fences: -Wno-tsan in the preset says so).
# Tests that start the megascope binary (training, agents) stay out: under a sanitizer they would
# build the whole tree, Gloo and BLAS included. Usage: scripts/sanitize.sh [asan|tsan]...
set -euo pipefail
cd "$(dirname "$0")/.."
presets=("$@")
((${#presets[@]})) || presets=(asan tsan)
declare -A targets=(
  [asan]="analyzer_pickle_test analyzer_slow_blame_test tracer_dump_test tracer_dump_stream_test tracer_arena_test tracer_rank_list_test tracer_stacks_test tracer_ring_test detector_test detector_samples_test detector_scenario_test"
  [tsan]="tracer_ring_test tracer_tracer_test tracer_nccl_plugin_test"
)
for p in "${presets[@]}"; do
  [[ -n ${targets[$p]:-} ]] || { echo "[sanitize] unknown preset $p (asan, tsan)" >&2; exit 2; }
  echo "[sanitize] $p: configure + build ${targets[$p]}"
  cmake --preset "$p" -DMEGASCOPE_WERROR="${MEGASCOPE_WERROR:-OFF}" >/dev/null
  # shellcheck disable=SC2086
  cmake --build --preset "$p" --target ${targets[$p]}
  filter=()
  for t in ${targets[$p]}; do
    filter+=("$(find "build/$p/tests" -name "$t" -type f -executable | head -1)")
  done
  for exe in "${filter[@]}"; do
    echo "[sanitize] $p: $(basename "$exe")"
    ASAN_OPTIONS=detect_leaks=1 TSAN_OPTIONS=halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$exe" --gtest_brief=1 >"build/$p/$(basename "$exe").log" 2>&1 || {
      tail -40 "build/$p/$(basename "$exe").log"
      echo "[sanitize] $p: $(basename "$exe") failed (log: build/$p/$(basename "$exe").log)" >&2
      exit 1
    }
  done
done
echo "[sanitize] clean"
