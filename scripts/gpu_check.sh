#!/usr/bin/env bash
# One batched GPU session (see /work/.library/device), from a build carried in .carry/
# (scripts/pack_carry.sh): the GPU tests; the runtime-only bundle tests; examples/aot_host (linking
# twell::runtime alone) on bundles made on the CPU machine against aot_host_jit (the same program with
# the JIT) on the embedded sample and the paper layer, sm_90a and sm_80 (y compared bit for bit); the
# main job; examples/train_ffn (a training step against the CPU reference); the benchmark rows of
# TWELL_BENCH_FILTER; with TWELL_TRAIN_BENCH=1 the training benchmarks (train_bench, TWELL_TRAIN_BENCH_FILTER). Full logs: $OUT/logs.tar.gz; a short table last.
set -u
C=${TWELL_CARRY:-.carry}
B=$C/build
D=$C/data
OUT=${OUT:-/tmp/twell-out}
LOGS=$(mktemp -d)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export TWELL_DATA_DIR=$D TWELL_CACHE_DIR=/tmp/twell-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
paper="$D/paper_l1_gate_a.safetensors $D/paper_l1_gate_b.safetensors $D/paper_l1_x.safetensors"
sample=tests/data/tiny_l1.safetensors
step() { local name=$1; shift; local t0=$(date +%s%N); "$@" > "$LOGS/$name.txt" 2>&1; local rc=$?;
         echo "$name rc=$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" >> "$LOGS/summary.txt"; }
# aot_host (runtime only) against aot_host_jit: the same inputs, y compared bit for bit.
aot() {  # name target bundle files...
  local name=$1 target=$2 bundle=$3; shift 3
  step aot_$name env LD_LIBRARY_PATH=$B/lib:$LD_LIBRARY_PATH $C/install/aot_host $bundle "$@" --layer 1 --target $target --out $LOGS/$name.aot.bin
  step jit_$name $B/bin/aot_host_jit - "$@" --layer 1 --target $target --out $LOGS/$name.jit.bin
  if cmp -s $LOGS/$name.aot.bin $LOGS/$name.jit.bin && [ -s $LOGS/$name.aot.bin ]; then echo "$name: y bit-identical ($(stat -c %s $LOGS/$name.aot.bin) bytes)" >> $LOGS/compare.txt
  else echo "$name: y DIFFERS or missing" >> $LOGS/compare.txt; fi
}
aot sample_sm90a sm_90a $C/test-bundles/sample/sm_90a $sample
aot sample_sm80 sm_80 $C/test-bundles/sample/sm_80 $sample
aot paper_sm90a sm_90a $C/bundles/paper/sm_90a $paper
aot paper_sm80 sm_80 $C/bundles/paper/sm_80 $paper
step runtime_only env TWELL_TEST_BUNDLES=$C/test-bundles TWELL_SOURCE_DIR=$PWD $B/bin/twell_runtime_only_tests
step run_sample $B/bin/twellc run
step gpu_tests $B/bin/twell_gpu_tests
step train_ffn $B/bin/train_ffn
[ "${TWELL_TRAIN_BENCH:-0}" = 1 ] && step train_bench $B/bin/train_bench --benchmark_filter="${TWELL_TRAIN_BENCH_FILTER:-BM_Train}"
[ "${TWELL_BENCH:-1}" = 1 ] && step bench $B/bin/ffn_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_filter="${TWELL_BENCH_FILTER:-.}"
tar -C "$LOGS" -czf "$OUT/logs.tar.gz" --exclude='*.bin' .
echo "--- aot_host (runtime only) vs aot_host_jit"; cat $LOGS/compare.txt
for f in $LOGS/aot_*.txt; do echo "$(basename $f):"; grep -E "bundle|plan:|run:|error|no GPU" $f; done
echo "--- runtime-only tests"; grep -E "^\[  (FAILED|PASSED) |Failure" "$LOGS/runtime_only.txt" | head -10
echo "--- run_sample"; grep -E "TwELL FFN|dense FFN|PASS|FAIL|error" "$LOGS/run_sample.txt"
echo "--- gpu tests"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Actual|Expected|Which is|differs" "$LOGS/gpu_tests.txt" | head -40
[ -f "$LOGS/bench.txt" ] && { echo "--- bench"; grep -E "median|Error|error" "$LOGS/bench.txt" | head -60; }
echo "--- summary"; cat "$LOGS/summary.txt"
