#!/usr/bin/env bash
# One batched GPU session (see /work/.library/device): the main job on the embedded sample and on the
# real data, the GPU and unit tests, the example and the benchmark, from a build carried in .carry/
# (scripts/pack_carry.sh). Full logs: $OUT/logs.tar.gz; a short table is printed last.
set -u
B=${TWELL_CARRY:-.carry}/build
D=${TWELL_CARRY:-.carry}/data
OUT=${OUT:-/tmp/twell-out}
LOGS=$(mktemp -d)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export TWELL_DATA_DIR=$D TWELL_CACHE_DIR=/tmp/twell-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
paper="$D/paper_l1_gate_a.safetensors $D/paper_l1_gate_b.safetensors $D/paper_l1_x.safetensors --layer 1 --random-up-down"
step() { local name=$1; shift; local t0=$(date +%s%N); "$@" > "$LOGS/$name.txt" 2>&1; local rc=$?;
         echo "$name rc=$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" >> "$LOGS/summary.txt"; }
step run_sample  $B/bin/twellc run
step run_sample2 $B/bin/twellc run                      # a second process: disk cache hits
step run_tiny0   $B/bin/twellc run $D/tiny_l01.safetensors --layer 0
step run_tiny1   $B/bin/twellc run $D/tiny_l01.safetensors --layer 1
step run_paper   $B/bin/twellc run $paper
step run_json    $B/bin/twellc run --json
step gpu_tests   $B/bin/twell_gpu_tests
step unit_tests  $B/bin/twell_unit_tests
step example     $B/bin/run_ffn 100
[ "${TWELL_BENCH:-1}" = 1 ] && step bench $B/bin/ffn_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_filter="${TWELL_BENCH_FILTER:-.}"
tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
for f in run_sample run_sample2 run_tiny0 run_tiny1 run_paper; do echo "--- $f"; grep -E "nnz per row|overflow|cache|TwELL FFN|dense FFN|PASS|FAIL|error" "$LOGS/$f.txt"; done
echo "--- gpu tests"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[ real \]|Failure|Actual|Expected|Which is|differs" "$LOGS/gpu_tests.txt" | head -60
echo "--- unit tests"; grep -E "^\[  (FAILED|PASSED) |Failure|error" "$LOGS/unit_tests.txt" | head -20
echo "--- example"; tail -3 "$LOGS/example.txt"
[ -f "$LOGS/bench.txt" ] && { echo "--- bench"; grep -E "median|Error|error" "$LOGS/bench.txt" | head -30; }
echo "--- summary"; cat "$LOGS/summary.txt"
