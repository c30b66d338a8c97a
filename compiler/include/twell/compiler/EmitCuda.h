// Emission of CUDA C++: one translation unit per specialized kernel op (after twell-specialize).
// Each unit instantiates a device template of kernels/device/twell/device/ (gate_twell.cuh,
// gated_down.cuh) with the kernel's constants and defines its extern "C" __global__ entry point.
#pragma once

#include <optional>
#include <vector>

#include "mlir/Support/LLVM.h"
#include "twell/Dialect/TwellAttrs.h"
#include "twell/compiler/Generate.h"

namespace mlir {
class Operation;
}

namespace mlir::twell {

// Emits the kernels of every twell.gate_matmul and twell.gated_down nested in `root`, in IR order.
// Fails, with an error diagnostic on the op, when an op is not specialized (no kernel_name, target
// or config) or its kernel_name is stale (the configuration changed after twell-specialize).
FailureOr<std::vector<::twell::compiler::KernelSource>> emitCudaKernels(Operation* root);

// The decode kernels (GeneratedFfn::decode) of a configured consumer op (twell.gated_down or
// twell.down after twell-specialize) with a `decode` attribute, reading w_down in that layout; none
// without it. Fails, with an error on the op, where `decode` is set but the kernels cannot be made: no
// config or target (run twell-select-config), an fma gate, the token block, or a shape or target
// DecodeKernelConstraints rule out (twell-select-config sets `decode` only where they can).
FailureOr<std::vector<::twell::compiler::KernelSource>> emitDecodeKernels(Operation* consumer);

}  // namespace mlir::twell
