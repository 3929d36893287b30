#!/usr/bin/env bash
# Fails when a C++ or CUDA source of the repository is not formatted by its .clang-format (the
# whole tree was formatted once; keep it so). Lists the files and the command that fixes them.
# Usage: scripts/check_format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "[format] clang-format is missing (scripts/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h' '*.cu' '*.cuh')  # new files too
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]} > 0)); then
  echo "[format] ${#bad[@]} file(s) differ from .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "[format] fix with: scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "[format] ${#files[@]} files formatted"
