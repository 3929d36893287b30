# Sourced by the GPU checks (scripts/gpu-check.sh run, scripts/gpu-trace-check.sh) on the GPU
# machine.

# gpu_unpack NAME: unpacks .gpu/megascope-gpu.tar.xz (made by `scripts/gpu-check.sh pack`) and sets
#   root    the unpacked tree (bin/, lib/ with libnccl-profiler-megascope.so, commit)
#   bin     the megascope binary, its libraries on LD_LIBRARY_PATH
#   device  the GPU's name (nvidia-smi); tag the same as a file-name part
# or says why not and exits 1. NAME: the calling check's, for its messages.
gpu_unpack() {
  local me=$1 pack=.gpu/megascope-gpu.tar.xz
  [[ -f $pack ]] || { echo "$me: no $pack (run 'scripts/gpu-check.sh pack' where nvcc is, and carry .gpu)" >&2; exit 1; }
  root=$(mktemp -d /tmp/megascope-gpu.XXXX)
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$root" || exit 1
  export LD_LIBRARY_PATH="$root/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  bin=$root/bin/megascope
  # cuBLASLt comes from the machine's CUDA toolkit, or else from PyTorch's wheels.
  if ldd "$bin" | grep -q 'libcublasLt.*not found'; then
    local lt
    lt=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
    [[ -n $lt ]] && export LD_LIBRARY_PATH="$(dirname "$lt"):$LD_LIBRARY_PATH"
  fi
  if ldd "$bin" | grep -q 'not found'; then
    echo "$me: libraries missing for $bin:" >&2
    ldd "$bin" | grep 'not found' >&2
    exit 1
  fi
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $device ]] || { echo "$me: nvidia-smi names no GPU here" >&2; exit 1; }
  tag=$(echo "$device" | tr -c 'A-Za-z0-9\n' '_' | sed 's/__*/_/g; s/_$//')
}

# The report: `say LINE` writes a line to the terminal and to $report; `check NAME STATUS DETAIL`
# says PASS or FAIL and keeps the names of the failed checks in `failed`.
failed=()
say() { echo "$*" | tee -a "$report"; }
check() {
  if [[ $2 == 0 ]]; then say "PASS  $1: $3"; else say "FAIL  $1: $3"; failed+=("$1"); fi
}
