// The twell compiler's passes (Passes.td) and the kernel pipeline that the generator runs.
#pragma once

#include <memory>
#include <string>

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::twell {

// twell-select-config's enum-typed options (Passes.td; the generator and the kernel pipeline pass
// them as these values, the command line as their names).
enum class ConsumerChoice { Rows, Block };                // consumer=rows|block
enum class DecodeChoice { Auto, OutIn, InOut, None };     // decode=auto|out_in|in_out|none

#define GEN_PASS_DECL
#include "twell/compiler/Passes.h.inc"

// Adds, nested on every func.func of the module `pm` runs on: twell-split-gated-ffn,
// twell-select-config with `options` (the one declaration of its options: Passes.td) and
// twell-specialize. After it every kernel op is explicit and named, ready for emitCudaKernels
// (EmitCuda.h). `pm` must be anchored on builtin.module. The registered pipeline
// `twell-kernel-pipeline` takes the same options as twell-select-config.
void buildTwellKernelPipeline(OpPassManager& pm, const TwellSelectConfigOptions& options);

#define GEN_PASS_REGISTRATION
#include "twell/compiler/Passes.h.inc"

}  // namespace mlir::twell
