#!/usr/bin/env bash
# Copies what a GPU run needs into .carry/ (ignored by git; name it in the device tool's `carry`): the
# built binaries and both libraries (the installed ones are the same files), examples/aot_host built
# against the installed package (ctest's install_aot_host), ctest's bundles (the sample's shape) and
# the paper shape's (sm_90a and sm_80), and the paper layer's real data (64 MiB per call: the other
# data files stay here unless TWELL_CARRY_DATA names them).
#
# `pack_carry.sh python`: only what scripts/gpu_python.sh needs (the two libraries, the paper layer's
# data or $TWELL_CARRY_DATA, the GCIDE corpus from scripts/fetch_gcide.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = python ]; then
  rm -rf .carry && mkdir -p .carry/lib .carry/data
  cp build/lib/libtwell_runtime.so build/lib/libtwell_jit.so .carry/lib/
  strip --strip-unneeded .carry/lib/*.so
  for f in ${TWELL_CARRY_DATA:-paper_l1_gate_a paper_l1_gate_b paper_l1_x}; do cp ../shared/data/$f.safetensors .carry/data/; done
  bash scripts/fetch_gcide.sh .carry/data/gcide.dict.dz > /dev/null
  du -sh .carry
  exit 0
fi
rm -rf .carry && mkdir -p .carry/build/bin .carry/build/lib .carry/data .carry/install .carry/bundles
cp build/lib/libtwell_runtime.so build/lib/libtwell_jit.so .carry/build/lib/
for b in twellc twell_unit_tests twell_gpu_tests twell_runtime_only_tests ffn_bench train_bench run_ffn train_ffn emit_ptx aot_host_jit; do
  cp build/bin/$b .carry/build/bin/
done
cp /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian .carry/build/lib/ 2>/dev/null || true
cp -r build/test-bundles .carry/test-bundles
cp build/aot_host/aot_host .carry/install/
strip --strip-unneeded .carry/build/lib/*.so .carry/build/bin/* .carry/install/aot_host 2>/dev/null || true
build/bin/twellc compile --d-model 2048 --d-ff 5632 --target sm_90a,sm_80 -o .carry/bundles/paper > /dev/null
for f in ${TWELL_CARRY_DATA:-paper_l1_gate_a paper_l1_gate_b paper_l1_x}; do cp ../shared/data/$f.safetensors .carry/data/; done
du -sh .carry
