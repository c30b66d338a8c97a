#!/bin/sh
# The layering rules of README.md "Architecture", checked on the sources (ctest `layering`):
#   - the runtime (runtime/include, runtime/src) includes no compiler, dialect, MLIR, LLVM or NVRTC header;
#   - the runtime's host sources define no kernels (__global__): every kernel comes from the emitter;
#   - the contract layer (kernels/include, kernels/src: the tuning file format) includes no MLIR, LLVM, CUDA
#     driver or runtime header.
root=${1:?usage: check_layers.sh SOURCE_DIR}
fail=0
hits=$(grep -rnE '#include *[<"](twell/compiler/|twell/Dialect/|mlir/|llvm/|nvrtc\.h)' "$root/runtime/include" "$root/runtime/src")
[ -n "$hits" ] && { echo "runtime includes a compiler/dialect/MLIR/NVRTC header:"; echo "$hits"; fail=1; }
hits=$(grep -rn '__global__' "$root/runtime/include" "$root/runtime/src")
[ -n "$hits" ] && { echo "__global__ in the runtime's host sources (kernels belong to the emitter):"; echo "$hits"; fail=1; }
hits=$(grep -rnE '#include *[<"](mlir/|llvm/|cuda\.h|twell/(context|plan|dense|compiler/|Dialect/))' "$root/kernels/include" "$root/kernels/src")
[ -n "$hits" ] && { echo "the contract layer includes an upper layer:"; echo "$hits"; fail=1; }
[ $fail = 0 ] && echo "layering: OK (runtime: no compiler, dialect, MLIR or NVRTC includes, no __global__; contracts: no MLIR, driver or runtime includes)"
exit $fail
