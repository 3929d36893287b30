#!/usr/bin/env bash
# Installs every Debian package megascope needs. Idempotent; quiet unless something fails.
# Runs apt-get update at most once per call, and only when a package is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgloo-dev prometheus-cpp-dev libcivetweb-dev libsqlite3-dev sqlite3 libcurl4-openssl-dev
  libboost-program-options-dev nlohmann-json3-dev libsimdjson-dev libunwind-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus python3 chromium clang libclang-rt-dev clang-format clang-tidy valgrind
  iproute2 nftables slurm-wlm munge patchelf clickhouse-server
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "[setup] need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "[setup] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { "${SUDO[@]}" apt-get update -q && \
       "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "[setup] apt-get failed while installing: ${missing[*]}" >&2
  exit 1
fi
