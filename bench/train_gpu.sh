#!/usr/bin/env bash
# Training throughput and MFU on one GPU, and what tracing costs there, side by side in one run:
# GPT models of about 124M, 350M and 1B parameters at (dp,tp,pp) = (1,1,1) on --device cuda, each
# one run with tracing on and off in alternating blocks of 2 steps (train --trace-alternate 2: on,
# off, off, on, ...), so the traced and untraced steps are seconds apart on the same GPU state.
#
# MFU = model FLOPs per token x tokens/s / the device's dense bf16 peak, with FLOPs per token
# = 6 N + 12 L w T (PaLM's appendix B: N every parameter, the tied embedding once, as its GEMM in
# the head is real work; L layers, w the width, T the sequence length: attention's QK^T and AV,
# forward and backward). Peak: 989 TFLOP/s for the H100 SXM and the H200 (NVIDIA's datasheets,
# dense bf16), or MEGASCOPE_PEAK_TFLOPS.
#
# Usage: bench/train_gpu.sh BIN DATA OUT_FILE [sizes]   (sizes: any of 124m 350m 1b; all three by
# default). Called by scripts/gpu-check.sh on a GPU machine; needs `megascope` built with CUDA.
# MEGASCOPE_BENCH_BATCH (global batch in sequences of 1,024 tokens, default 8) and
# MEGASCOPE_BENCH_MICROBATCHES (default 1) set the batch; MEGASCOPE_BENCH_STEPS the steps (16).
set -euo pipefail
bin=$1 data=$2 out=$3
sizes=${4:-"124m 350m 1b"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
peak=${MEGASCOPE_PEAK_TFLOPS:-989}
steps=${MEGASCOPE_BENCH_STEPS:-16}
{
  echo "# bench/train_gpu.sh on $device (dense bf16 peak taken as $peak TFLOP/s)"
  echo "# date: $(date -u +%FT%TZ); $steps steps per model, the first 4 dropped; tracing alternates in blocks of 2 steps;" \
    "global batch ${MEGASCOPE_BENCH_BATCH:-8} x 1024 tokens in ${MEGASCOPE_BENCH_MICROBATCHES:-1} microbatch(es)"
  printf "%-6s %6s %6s %5s %6s %7s %9s %11s %11s %8s %9s\n" model params layers width heads seq tokens/stp \
    "step_on(s)" "step_off(s)" "MFU_off" "trace_cost"
} | tee "$out"
for size in $sizes; do
  case $size in
    124m) L=12 W=768 H=12 ;;
    350m) L=24 W=1024 H=16 ;;
    1b) L=18 W=2048 H=16 ;;
    *) echo "bench/train_gpu.sh: unknown size $size (124m, 350m, 1b)" >&2; exit 2 ;;
  esac
  T=1024 V=50304 B=${MEGASCOPE_BENCH_BATCH:-8} M=${MEGASCOPE_BENCH_MICROBATCHES:-1}
  rm -rf "$work/run"
  if ! timeout 150 "$bin" train --device cuda --no-agents --data "$data" --run-dir "$work/run" --job "gpubench$size" \
    --layers $L --width $W --heads $H --seq $T --vocab $V --batch $B --microbatches $M --steps "$steps" \
    --warmup 2 --trace-alternate 2 >"$work/train.log" 2>&1; then
    echo "$size: training failed; last lines:" | tee -a "$out"
    tail -20 "$work/train.log" | tee -a "$out"
    [[ -f $work/run/ranks/0/worker.log ]] && tail -20 "$work/run/ranks/0/worker.log" | tee -a "$out"
    exit 1
  fi
  python3 - "$work/run/ranks/0/step_costs.csv" "$size" "$L" "$W" "$H" "$T" "$V" "$B" "$peak" <<'PY' | tee -a "$out"
import csv, statistics, sys
path, size = sys.argv[1], sys.argv[2]
L, W, H, T, V, B = map(int, sys.argv[3:9])
peak = float(sys.argv[9]) * 1e12
rows = [r for r in csv.DictReader(open(path)) if int(r["step"]) >= 4]
on = [int(r["wall_ns"]) / 1e9 for r in rows if r["traced"] == "1"]
off = [int(r["wall_ns"]) / 1e9 for r in rows if r["traced"] == "0"]
# Parameters as the model holds them: wte (tied), wpe, per layer 2 LNs, QKV, proj, MLP.
n = V * W + T * W + L * (4 * W + 3 * W * W + 3 * W + W * W + W + 4 * W * W + 4 * W + 4 * W * W + W) + 2 * W
flops_per_token = 6 * n + 12 * L * W * T
tokens = B * T
m_on, m_off = statistics.median(on), statistics.median(off)
mfu = flops_per_token * tokens / m_off / peak
print(f"{size:6s} {n/1e6:5.0f}M {L:6d} {W:5d} {H:6d} {T:7d} {tokens:9d} {m_on:11.4f} {m_off:11.4f} "
      f"{mfu*100:7.1f}% {(m_on/m_off-1)*100:+8.2f}%")
PY
done
