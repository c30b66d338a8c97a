#!/usr/bin/env bash
# One batched GPU session (see /work/.library/device): the main job on the embedded sample and on the
# real data, the GPU tests, and the benchmark, from a build carried in .carry/ (build/bin, build/lib)
# with the real data in .carry/data. Full logs go to $OUT; a short table is printed last.
set -u
B=${TWELL_CARRY:-.carry}/build
D=${TWELL_CARRY:-.carry}/data
OUT=${OUT:-/tmp/twell-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export TWELL_DATA_DIR=$D TWELL_CACHE_DIR=/tmp/twell-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step() { local name=$1; shift; local t0=$(date +%s.%N); "$@" > "$OUT/$name.txt" 2>&1; local rc=$?;
         printf '%-22s rc=%-3s %6.1fs\n' "$name" "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)" >> "$OUT/summary.txt"; return $rc; }
: > "$OUT/summary.txt"
step run_sample  $B/bin/twellc run
step run_sample2 $B/bin/twellc run                      # second process: disk cache hits
step run_tiny0   $B/bin/twellc run $D/tiny_l01.safetensors --layer 0
step run_tiny1   $B/bin/twellc run $D/tiny_l01.safetensors --layer 1
step run_paper   $B/bin/twellc run $D/paper_l1_gate_a.safetensors $D/paper_l1_gate_b.safetensors $D/paper_l1_x.safetensors --layer 1 --random-up-down
step run_paper31 $B/bin/twellc run $D/paper_l1_gate_a.safetensors $D/paper_l1_gate_b.safetensors $D/paper_l1_x.safetensors --layer 1 --random-up-down --slots 31
step run_json    $B/bin/twellc run --json
step gpu_tests   $B/bin/twell_gpu_tests
step unit_tests  $B/bin/twell_unit_tests
step example     $B/bin/run_ffn 100
if [ "${TWELL_BENCH:-1}" = 1 ]; then
  step bench $B/bin/ffn_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
fi
for f in run_sample run_sample2 run_tiny0 run_paper run_paper31; do echo "--- $f"; grep -E "nnz per row|overflow|cache|TwELL FFN|dense FFN|PASS|FAIL|error" "$OUT/$f.txt"; done
echo "--- gpu tests"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[ real \]|Failure|error" "$OUT/gpu_tests.txt" | head -40
echo "--- unit tests"; grep -E "^\[  (FAILED|PASSED) " "$OUT/unit_tests.txt"
[ -f "$OUT/bench.txt" ] && { echo "--- bench"; grep -E "median|Error|error" "$OUT/bench.txt" | head -30; }
echo "--- summary"; cat "$OUT/summary.txt"
