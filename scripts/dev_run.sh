#!/usr/bin/env bash
# A short device session for kernel work: the GPU tests, then the benchmarks matching $1 (a Google
# Benchmark filter), one repetition each, as a compact table (name, ms, counters). Needs .carry
# (scripts/pack_carry.sh); scripts/gpu_check.sh is the full session.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:.carry/build/lib:$LD_LIBRARY_PATH TWELL_CACHE_DIR=/tmp/tc TWELL_DATA_DIR=.carry/data
B=.carry/build/bin
[ "${TWELL_TESTS:-1}" = 1 ] && timeout 300 $B/twell_gpu_tests 2>&1 |
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[ real \]|Failure|Actual|Expected|Which is|differs|error|token block|\[ split \]" | head -100
timeout 400 $B/ffn_bench --benchmark_filter="${1:-BM_Consumer}" --benchmark_repetitions=1 2>&1 |
  grep -E "BM_|rror" | awk '{printf "%s %s", $1, $2; for (i = 4; i <= NF; ++i) if ($i ~ /=/) printf " %s", $i; print ""}'
