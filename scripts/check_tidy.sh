#!/usr/bin/env bash
# clang-tidy (the repository's .clang-tidy, warnings as errors) over the C++ files changed since
# BASE (default: the previous commit), with the dev build's compile_commands.json. The tree is
# not yet clean as a whole; every change keeps the files it touches clean.
# Usage: scripts/check_tidy.sh [BASE]   (run after the dev preset is configured)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
command -v clang-tidy >/dev/null || { echo "[tidy] clang-tidy is missing (scripts/setup.sh installs it)" >&2; exit 1; }
[[ -f build/dev/compile_commands.json ]] || { echo "[tidy] configure the dev preset first (cmake --preset dev)" >&2; exit 1; }
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "[tidy] no commit $base to compare with: nothing to check"
  exit 0
fi
# CUDA-only sources (*/cuda/*, tests/*/cuda_*test.cc) are not in the dev build's compile database;
# the cuda preset compiles them with -Werror instead.
mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$base" -- '*.cc' |
  grep -v -E '^tests/fuzz/|/cuda/|/cuda_[a-z_]*test\.cc$' || true)
if ((${#files[@]} == 0)); then
  echo "[tidy] no C++ source changed since $base"
  exit 0
fi
echo "[tidy] ${#files[@]} changed file(s) since $base"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
printf '%s\n' "${files[@]}" | xargs -P 2 -n 4 clang-tidy -p build/dev --quiet --warnings-as-errors='*' >"$out" 2>&1 || status=$?
grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated|^Suppressed [0-9]+ warnings|^Use -header-filter' "$out" || true
if ((status != 0)); then
  echo "[tidy] clang-tidy found problems (above)" >&2
  exit 1
fi
echo "[tidy] clean"
