// The twell compiler's passes (Passes.td) and the kernel pipeline that the generator runs.
#pragma once

#include <memory>
#include <string>

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::twell {

#define GEN_PASS_DECL
#include "twell/compiler/Passes.h.inc"

// Adds, nested on every func.func of the module `pm` runs on: twell-split-gated-ffn,
// twell-select-config{target=arch} and twell-specialize. After it every kernel op is explicit and
// named, ready for emitCudaKernels (EmitCuda.h). `pm` must be anchored on builtin.module.
// `clusterM`: the wgmma gate's cluster_m (0: the heuristic's). `decode`: twell-select-config's option
// (auto, out_in, in_out or none: the w_down layout of the consumers' decode kernels).
void buildTwellKernelPipeline(OpPassManager& pm, llvm::StringRef arch, llvm::StringRef consumer = "rows",
                              int64_t clusterM = 0, llvm::StringRef decode = "auto");

#define GEN_PASS_REGISTRATION
#include "twell/compiler/Passes.h.inc"

}  // namespace mlir::twell
