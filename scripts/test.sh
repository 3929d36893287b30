#!/usr/bin/env bash
# Installs what is missing, checks the tree's formatting, builds with both cores, runs clang-tidy
# over the files the last commit changed and the default tests (CTest labels gpu, slow and bench
# stay out), then the asan and tsan presets over a fixed subset of the unit tests
# (scripts/sanitize.sh names it) and each libFuzzer target briefly. Where nvcc exists it also configures and
# compiles the cuda preset.
# Warnings are errors under CI (CI=true) or with MEGASCOPE_WERROR=ON.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's time, said as it ends and all together when the run ends (kept with
# bench/ci_repeat.sh's results): where CI's minutes go.
stage_name="" stage_start=$SECONDS stage_times=()
stage() {  # stage TITLE: ends the stage before (its time said) and starts TITLE
  if [[ -n $stage_name ]]; then
    local took=$((SECONDS - stage_start))
    stage_times+=("$(printf '%5d s  %s' "$took" "$stage_name")")
    echo "[test] ... ${took} s"
  fi
  stage_name=$1 stage_start=$SECONDS
  [[ -z $1 ]] || echo "[test] $1"
}
stage_summary() {
  stage ""
  echo "[test] stage times (total $SECONDS s):"
  printf '[test]   %s\n' "${stage_times[@]}"
}
trap stage_summary EXIT

stage "setup (scripts/setup.sh)"
scripts/setup.sh
werror=${MEGASCOPE_WERROR:-OFF}
[[ ${CI:-} == true ]] && werror=ON

stage "formatting (scripts/check_format.sh)"
scripts/check_format.sh

stage "configure + build (dev preset, 2 jobs)"
cmake --preset dev -DMEGASCOPE_WERROR="$werror" >/dev/null
cmake --build --preset dev

stage "clang-tidy over the files the last commit changed (scripts/check_tidy.sh)"
scripts/check_tidy.sh
stage "ctest (without gpu, slow, bench)"
ctest --preset dev

stage "asan and tsan over a fixed subset of the unit tests (scripts/sanitize.sh)"
MEGASCOPE_WERROR="$werror" scripts/sanitize.sh

stage "fuzzing every reader of foreign input for 10 s each (scripts/fuzz.sh)"
scripts/fuzz.sh 10

if command -v nvcc >/dev/null 2>&1; then
  stage "nvcc found: compiling the cuda preset and its gpu tests (run on a GPU machine only: scripts/gpu-check.sh)"
  cmake --preset cuda -DMEGASCOPE_WERROR="$werror" -DMEGASCOPE_BUILD_TESTS=ON -DMEGASCOPE_BUILD_BENCH=OFF >/dev/null
  cmake --build --preset cuda --target megascope megascope_gpu_tests
  # The CUDA build's own servers start without a GPU: its agent must listen (cuBLASLt's static TLS
  # once left civetweb's threads no stack, cli/thread_stacks.cc).
  smoke=$(mktemp -d)
  # (timeout ends it after 3 s and says 124: the log decides)
  timeout -s INT 3 build/cuda/cli/megascope agent --run-dir "$smoke" --node smoke >"$smoke/agent.log" 2>&1 || true
  grep -q 'http://127.0.0.1:' "$smoke/agent.log" ||
    { echo "[test] the cuda build's agent did not start:" >&2; cat "$smoke/agent.log" >&2; exit 1; }
  rm -rf "$smoke"
fi
