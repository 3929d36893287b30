#!/usr/bin/env bash
# The GPU runtime's check, in two halves, because the GPU machines lent to us are bare (CUDA,
# PyTorch, CMake; none of megascope's apt dependencies, and nothing can be fetched there):
#
#   scripts/gpu-check.sh pack
#       Here (any machine with nvcc): builds the cuda preset (sm_90: H100/H200) with the gpu
#       tests, and packs the megascope binary, the gpu test binaries, the in-process library
#       (NCCL profiler plugin and CUDA injection) and every shared library they
#       need that is not glibc's or CUDA's into .gpu/megascope-gpu.tar.xz (about 15 MB; .gpu/ is
#       ignored by git: carry it to the GPU machine).
#   scripts/gpu-check.sh run [OUT_DIR]
#       There, from the repository root (8 minutes at most on an H100): unpacks .gpu/, then
#         1. the gpu tests (every CUDA kernel against its CPU reference, a whole GPT stage on both
#            backends, CUDA-event span timing, the NCCL transport: stream-ordered ops, "started on
#            the device" from the watchdog, a hung op aborted at its deadline, the rebuild);
#         2. a (1,1,1) run of 20 steps on CUDA whose losses match the CPU run of the same model
#            step by step within bf16 tolerance (3 %), and the same run over NCCL (--comm nccl)
#            as close to the run over Gloo as two runs over Gloo are to each other;
#         3. a (2,2,2) job of 8 processes on the one GPU (CUDA compute, Gloo through pinned host
#            buffers) under `megascope launch` with a hang injected: named, evicted, recovered;
#            its trace.db holds compute spans timed by CUDA events and its timeline draws them;
#         4. NVML's GPU metrics in an agent's /metrics while a CUDA job trains;
#         5. bench/train_gpu.sh: MFU at ~124M, ~350M and ~1B parameters, tracing on vs off.
#       Everything is written to bench/results/gpu_check_<device>.txt (and copied to OUT_DIR);
#       exits 1 if any check failed, naming it.
set -uo pipefail
cd "$(dirname "$0")/.."
pack=.gpu/megascope-gpu.tar.xz

if [[ ${1:-} == pack ]]; then
  set -e
  command -v nvcc >/dev/null || { echo "gpu-check pack: nvcc is not on the PATH" >&2; exit 1; }
  command -v patchelf >/dev/null || { echo "gpu-check pack: patchelf is missing (scripts/setup.sh installs it)" >&2; exit 1; }
  cmake --preset cuda -DMEGASCOPE_BUILD_TESTS=ON -DMEGASCOPE_BUILD_BENCH=OFF >/dev/null
  cmake --build --preset cuda --target megascope megascope_gpu_tests nccl_profiler_megascope
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib" .gpu
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  bins=(build/cuda/cli/megascope build/cuda/tests/kernels/kernels_cuda_test
        build/cuda/tests/tracer/tracer_cuda_timer_test build/cuda/tests/runtime/runtime_nccl_test)
  for b in "${bins[@]}"; do
    cp "$b" "$stage/bin/" && strip "$stage/bin/$(basename "$b")"
  done
  # Shared libraries outside glibc and the CUDA toolkit (the GPU machine has both).
  for b in "${bins[@]}"; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|libnsl|libanl|libutil|libmvec|libnss_[a-z]+|libthread_db|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so|/usr/local/cuda|libcuda\.so|libnvidia' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  # Each binary finds the libraries packed beside it through its own RPATH (transitively, as
  # DT_RPATH is), so nothing of ours goes on LD_LIBRARY_PATH there: the PyTorch jobs that the
  # checks start keep the machine's libraries.
  for f in "$stage"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"; done
  for f in "$stage"/lib/*.so*; do [[ -L $f ]] || patchelf --force-rpath --set-rpath '$ORIGIN' "$f"; done
  # megascope's in-process library (scripts/gpu-trace-check.sh): where `wrap` looks beside the
  # binary, with its second name.
  cp build/cuda/tracer/nccl/libnccl-profiler-megascope.so "$stage/lib/"
  ln -s libnccl-profiler-megascope.so "$stage/lib/libmegascope-cupti.so"
  git rev-parse --short HEAD >"$stage/commit"
  tar -C "$stage" -cJf "$pack" .
  echo "gpu-check pack: $pack ($(du -h "$pack" | cut -f1)), commit $(cat "$stage/commit"); carry .gpu and run: scripts/gpu-check.sh run \$OUT"
  exit 0
fi

if [[ ${1:-} != run ]]; then
  sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi

outdir=${2:-}
source scripts/gpu-common.sh
gpu_unpack gpu-check
report=bench/results/gpu_check_${tag}.txt
work=$root/work
mkdir -p "$work" bench/results
start=$(date +%s)
: >"$report"
say "# scripts/gpu-check.sh run: megascope $(cat "$root/commit") (built with the cuda preset elsewhere and carried)"
say "# device: $device; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); $(nproc) cores; $(date -u +%FT%TZ)"

"$bin" prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null

# 1. gpu tests
if part 1; then
for t in kernels_cuda_test tracer_cuda_timer_test runtime_nccl_test; do
  timeout 120 "$root/bin/$t" --gtest_brief=1 >"$work/$t.log" 2>&1
  rc=$?
  check "$t" $rc "$(grep -E '^\[  (PASSED|FAILED)' "$work/$t.log" | tr '\n' ' ')"
  [[ $rc == 0 ]] || grep -E 'Failure|error|Expected|Which is|worst' "$work/$t.log" | head -20 | tee -a "$report"
done
fi

# 2. CUDA vs CPU losses, (1,1,1), 20 steps
if part 2; then
model=(--layers 4 --width 256 --heads 4 --seq 128 --batch 8 --microbatches 2 --steps 20 --lr 1e-3)
for dev in cpu cuda cuda2 nccl; do
  flags=(--device "${dev%2}")
  [[ $dev == nccl ]] && flags=(--device cuda --comm nccl)
  limit=90
  [[ $dev == cpu ]] && limit=180
  timeout $limit "$bin" train "${flags[@]}" --no-agents --data "$work/data.bin" --run-dir "$work/parity_$dev" \
    --job "parity$dev" "${model[@]}" >"$work/parity_$dev.log" 2>&1
  echo "$?" >"$work/parity_$dev.rc"
done
detail=$(python3 - "$work/parity_cpu/progress.jsonl" "$work/parity_cuda/progress.jsonl" <<'PY'
import json, sys
def losses(p):
    try:
        return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
    except OSError:
        return []
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
if len(cpu) != 20 or len(gpu) != 20:
    print(f"steps: cpu {len(cpu)}, cuda {len(gpu)} (want 20 each)"); sys.exit(1)
rel = [abs(g - c) / abs(c) for c, g in zip(cpu, gpu)]
worst = max(range(20), key=lambda i: rel[i])
print(f"20 steps; loss cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, cuda {gpu[0]:.4f} -> {gpu[-1]:.4f}; "
      f"worst step {worst + 1}: {rel[worst] * 100:.2f} % apart (tolerance 3 %)")
sys.exit(0 if rel[worst] <= 0.03 else 1)
PY
)
check "cuda-vs-cpu losses" $? "$detail"
# Two CUDA runs over Gloo differ a little (atomicAdd sums gradients in no fixed order); the run over
# NCCL must be as close to them as they are to each other.
detail=$(python3 - "$work/parity_cuda/progress.jsonl" "$work/parity_cuda2/progress.jsonl" "$work/parity_nccl/progress.jsonl" <<'PY'
import json, sys
def losses(p):
    try:
        return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
    except OSError:
        return []
gloo, again, nccl = (losses(p) for p in sys.argv[1:4])
if len(gloo) != 20 or len(again) != 20 or len(nccl) != 20:
    print(f"steps: gloo {len(gloo)}, gloo again {len(again)}, nccl {len(nccl)} (want 20 each)"); sys.exit(1)
def worst(x, y):
    return max(abs(a - b) / abs(a) for a, b in zip(x, y))
aa, nv = worst(gloo, again), worst(gloo, nccl)
limit = max(1e-5, 3 * aa)
print(f"20 steps over NCCL; worst step {nv * 100:.4f} % from the run over Gloo; two runs over Gloo "
      f"{aa * 100:.4f} % apart (tolerance: 3 times that, at least 0.001 %)")
sys.exit(0 if nv <= limit else 1)
PY
)
check "nccl-vs-gloo losses" $? "$detail"
grep -h "computing on\|timed by" "$work/parity_cuda/ranks/0/worker.log" 2>/dev/null | head -2 | tee -a "$report"
fi

# 3. (2,2,2) on one GPU under launch, a hang injected at step 8
if part 3; then
timeout 240 "$bin" launch --device cuda --nodes 2 --spares 1 --dp 2 --tp 2 --pp 2 --data "$work/data.bin" \
  --run-dir "$work/launch" --job gpulaunch --layers 4 --width 256 --heads 4 --seq 128 --batch 8 \
  --microbatches 2 --steps 24 --checkpoint-every 4 --inject hang:node=node1,at=8 >"$work/launch.log" 2>&1
rc=$?
"$bin" report "$work/launch" >"$work/report.txt" 2>&1
named=$(grep -c -i "hang" "$work/report.txt")
evicted=$(grep -c "node1" "$work/report.txt")
last=$(grep -o '"step":[0-9]*' "$work/launch/progress.jsonl" 2>/dev/null | tail -1 | cut -d: -f2)
[[ $rc == 0 && $named -gt 0 && $evicted -gt 0 && ${last:-0} == 24 ]]
check "(2,2,2) hang on one GPU" $? "launch exit $rc; report names a hang ($named lines) and node1 ($evicted lines); last step ${last:-none} of 24"
[[ $rc == 0 ]] || tail -15 "$work/launch.log" | tee -a "$report"
sed -n '1,12p' "$work/report.txt" | sed 's/^/    /' | tee -a "$report"
spans=$(python3 - "$work/launch" <<'PY'
import glob, sqlite3, sys
n = 0
for db in glob.glob(sys.argv[1] + "/nodes/*/trace.db"):
    c = sqlite3.connect(db)
    n += c.execute("SELECT count(*) FROM span_rows WHERE kind IN (0, 1)").fetchone()[0]
print(n)
PY
)
"$bin" timeline "$work/launch" --steps 2:4 -o "$work/timeline.json" >/dev/null 2>&1
tl=$(grep -o '"ph": *"X"' "$work/timeline.json" 2>/dev/null | wc -l)
timed=$(grep -l "CUDA events" "$work"/launch/ranks/*/worker.log 2>/dev/null | wc -l)
[[ ${spans:-0} -gt 0 && $tl -gt 0 && $timed -gt 0 ]]
check "CUDA-event spans" $? "trace.db: ${spans:-0} forward/backward spans; timeline of steps 2-4: $tl complete events; $timed worker logs say CUDA events time them"
fi

# 4. NVML metrics from an agent while a CUDA job trains
if part 4; then
"$bin" train --device cuda --data "$work/data.bin" --run-dir "$work/nvml" --job gpunvml --layers 4 \
  --width 256 --heads 4 --seq 128 --batch 8 --microbatches 2 --steps 400 >"$work/nvml.log" 2>&1 &
job=$!
found=""
for _ in $(seq 60); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*/metrics' "$work/nvml.log" | head -1)
  if [[ -n $url ]]; then
    found=$(python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())" "$url" 2>/dev/null |
      grep -E '^megascope_gpu_(utilization_ratio|power_watts|temperature_celsius)' | head -3)
    [[ -n $found ]] && break
  fi
  sleep 1
done
kill -INT $job 2>/dev/null; wait $job 2>/dev/null
[[ -n $found ]]
check "NVML in /metrics" $? "$(echo "$found" | tr '\n' ';')"
fi

# 5. MFU and the cost of tracing (MEGASCOPE_GPU_SKIP_MFU=1: not this time, e.g. to rerun the other
if part 5; then
# checks inside what is left of a lease)
if [[ ${MEGASCOPE_GPU_SKIP_MFU:-} == 1 ]]; then
  say "SKIP  bench/train_gpu.sh: MEGASCOPE_GPU_SKIP_MFU=1"
elif bench/train_gpu.sh "$bin" "$work/data.bin" "$work/train_gpu.txt"; then
  sed 's/^/    /' "$work/train_gpu.txt" | tee -a "$report"
  check "bench/train_gpu.sh" 0 "MFU and tracing cost above"
else
  sed 's/^/    /' "$work/train_gpu.txt" | tee -a "$report"
  check "bench/train_gpu.sh" 1 "MFU and tracing cost above"
fi
fi

say "# $(( $(date +%s) - start )) s on $device"
if [[ -n $outdir ]]; then
  mkdir -p "$outdir"
  cp "$report" "$outdir/"
  tar -C "$work" -czf "$outdir/gpu_check_logs.tar.gz" --exclude='*.bin' --exclude='trace.db*' . 2>/dev/null
fi
if ((${#failed[@]})); then
  say "gpu-check: FAILED: ${failed[*]}"
  exit 1
fi
say "gpu-check: every check passed"
