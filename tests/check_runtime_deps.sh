#!/bin/sh
# libtwell_runtime.so must run where LLVM, MLIR and NVRTC are absent (ctest `runtime_deps`): no such
# symbol among its dynamic symbols (nm -DC: defined or needed) and no such library among its
# dependencies (readelf NEEDED).
lib=${1:?usage: check_runtime_deps.sh libtwell_runtime.so}
fail=0
syms=$(nm -DC "$lib" | grep -Ei 'mlir|llvm|nvrtc' | head -5)
[ -n "$syms" ] && { echo "$lib has LLVM/MLIR/NVRTC symbols:"; echo "$syms"; fail=1; }
needed=$(readelf -d "$lib" | grep NEEDED)
echo "$needed" | grep -Eiq 'llvm|mlir|nvrtc' && { echo "$lib depends on LLVM/MLIR/NVRTC:"; echo "$needed"; fail=1; }
[ $fail = 0 ] && { echo "runtime_deps: OK, $lib needs:"; echo "$needed" | sed 's/.*Shared library: /  /'; }
exit $fail
