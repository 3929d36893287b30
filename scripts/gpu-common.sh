# Sourced by the GPU checks (scripts/gpu-check.sh run, scripts/gpu-trace-check.sh) on the GPU
# machine.

# gpu_unpack NAME: unpacks .gpu/megascope-gpu.tar.xz (made by `scripts/gpu-check.sh pack`) and sets
#   root    the unpacked tree (bin/, lib/ with libnccl-profiler-megascope.so, commit)
#   bin     the megascope binary (its own libraries beside it, found through its RPATH; CUDA's
#           from the machine, their folders put on LD_LIBRARY_PATH where the loader misses them)
#   device  the GPU's name (nvidia-smi); tag the same as a file-name part
# or says why not and exits 1. NAME: the calling check's, for its messages.
gpu_unpack() {
  local me=$1 pack=.gpu/megascope-gpu.tar.xz
  [[ -f $pack ]] || { echo "$me: no $pack (run 'scripts/gpu-check.sh pack' where nvcc is, and carry .gpu)" >&2; exit 1; }
  root=$(mktemp -d /tmp/megascope-gpu.XXXX)
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$root" || exit 1
  bin=$root/bin/megascope
  # CUDA's libraries (cuBLASLt, NCCL, CUPTI, the runtime) come from the machine's CUDA toolkit or
  # else from PyTorch's wheels (nvidia/*/lib under its site-packages): each one ldd misses is
  # looked for there, and the folder found goes on LD_LIBRARY_PATH.
  local lib found
  for lib in $(ldd "$bin" "$root"/bin/* 2>/dev/null | awk '/not found/ {print $1}' | sort -u); do
    found=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
    [[ -n $found ]] && export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  if ldd "$bin" | grep -q 'not found'; then
    echo "$me: libraries missing for $bin:" >&2
    ldd "$bin" | grep 'not found' >&2
    exit 1
  fi
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $device ]] || { echo "$me: nvidia-smi names no GPU here" >&2; exit 1; }
  tag=$(echo "$device" | tr -c 'A-Za-z0-9\n' '_' | sed 's/__*/_/g; s/_$//')
}

# `if part N; then ...`: whether check N runs (MEGASCOPE_GPU_PARTS="3 4": only those; all when unset),
# to spend what is left of a lease on the checks that failed.
part() { [[ -z ${MEGASCOPE_GPU_PARTS:-} || " $MEGASCOPE_GPU_PARTS " == *" $1 "* ]]; }

# The report: `say LINE` writes a line to the terminal and to $report; `check NAME STATUS DETAIL`
# says PASS or FAIL and keeps the names of the failed checks in `failed`.
# `owe NAME DETAIL`: a check this machine cannot decide (said as OWED, kept in `owed`).
failed=()
owed=()
say() { echo "$*" | tee -a "$report"; }
check() {
  if [[ $2 == 0 ]]; then say "PASS  $1: $3"; else say "FAIL  $1: $3"; failed+=("$1"); fi
}
owe() {
  say "OWED  $1: $2"
  owed+=("$1")
}
