#!/usr/bin/env bash
# Copies what a GPU run needs into .carry/ (ignored by git; name it in the device tool's `carry`):
# the built binaries and library, and the real data that ../shared/data holds here.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/build/bin .carry/build/lib .carry/data
cp build/lib/libtwell.so .carry/build/lib/
for b in twellc twell_unit_tests twell_gpu_tests ffn_bench run_ffn emit_ptx; do cp build/bin/$b .carry/build/bin/; done
cp /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian .carry/build/lib/ 2>/dev/null || true
strip --strip-unneeded .carry/build/lib/libtwell.so .carry/build/bin/* 2>/dev/null || true
for f in ${TWELL_CARRY_DATA:-tiny_l01 paper_l1_gate_a paper_l1_gate_b paper_l1_x paper_patterns}; do cp ../shared/data/$f.safetensors .carry/data/; done
du -sh .carry
