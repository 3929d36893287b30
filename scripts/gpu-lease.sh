#!/usr/bin/env bash
# Both GPU checks in one lease of a GPU machine (about 6 minutes on an H200 when they pass: 115 s
# and about 190 s, the second's cost check alone about 160 s):
# scripts/record-pytorch-fr.py (CPU only) runs beside scripts/gpu-check.sh, then
# scripts/gpu-trace-check.sh, each under a time limit so that one stuck check leaves the others
# their time. Everything worth reading comes back in OUT_DIR (at most 6 files):
#   console.log               both checks' output
#   gpu_check_<device>.txt    the reports (also left in bench/results/)
#   gpu_trace_<device>.txt
#   work.tar.gz               every run's logs, reports and timelines (no databases, no data)
#   pytorch_real.tar.gz       tests/data/pytorch/real: the recorded dumps, to unpack and commit
#
# Usage, here: scripts/gpu-check.sh pack; then on the GPU machine, carrying .gpu:
#   scripts/gpu-lease.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-lease.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# The machine's loopback, which every megascope server listens on (127.0.0.1:0): said, and brought
# up where it is down.
python3 - >"$out/console.log" 2>&1 <<'PY'
import fcntl, socket, struct
def bind():
    try:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); s.close(); return "ok"
    except OSError as e:
        return str(e)
print("loopback: bind 127.0.0.1:0:", bind(), "; localhost is", socket.getaddrinfo("localhost", 0)[0][4][0])
req = struct.pack("16sH", b"lo", 0)
flags = struct.unpack("16sH", fcntl.ioctl(socket.socket(), 0x8913, req))[1]  # SIOCGIFFLAGS
print("loopback: lo flags 0x%x (%s)" % (flags, "up" if flags & 1 else "down"))
if not flags & 1:
    fcntl.ioctl(socket.socket(), 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS
    print("loopback: brought lo up; bind 127.0.0.1:0:", bind())
PY
(timeout 200 python3 scripts/record-pytorch-fr.py >"$out/record.log" 2>&1; echo "rc=$?" >>"$out/record.log") &
recorder=$!
timeout 270 scripts/gpu-check.sh run >>"$out/console.log" 2>&1
check_rc=$?
wait $recorder
MEGASCOPE_RECORD_LOG=$out/record.log timeout 240 scripts/gpu-trace-check.sh >>"$out/console.log" 2>&1
trace_rc=$?
echo "gpu-check exit $check_rc, gpu-trace-check exit $trace_rc" | tee -a "$out/console.log"
cat "$out/record.log" >>"$out/console.log" && rm "$out/record.log"
cp bench/results/gpu_check_*.txt bench/results/gpu_trace_*.txt "$out/" 2>/dev/null
tar -czf "$out/work.tar.gz" --exclude='*.bin' --exclude='trace.db*' --exclude='*.tar.xz' \
  /tmp/megascope-gpu.*/work 2>/dev/null
tar -czf "$out/pytorch_real.tar.gz" tests/data/pytorch/real 2>/dev/null
((check_rc == 0 && trace_rc == 0))
