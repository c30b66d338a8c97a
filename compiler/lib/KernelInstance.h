// The constants of one kernel, read from a kernel-level op (twell.gate_matmul or twell.gated_down)
// once its target and config are set. Shared by twell-specialize (which names the kernel) and the
// CUDA emitter (which writes the constants), so that the name is derived from exactly what is
// emitted.
#pragma once

#include <cstdint>
#include <string>

#include "mlir/IR/Operation.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/Generate.h"

namespace mlir::twell {

struct KernelInstance {
  ::twell::compiler::KernelKind kind;
  Operation* op;
  int64_t dModel;  // K of the gate GEMM, the output width of the consumer
  int64_t dFF;     // N of the gate GEMM
  LayoutAttr layout;
  TargetAttr target;
  ConfigAttr config;
  DownLayout downLayout;  // the consumer's w_down layout (OutIn for the gate kernel)

  // Reads a kernel op. Fails with an error on `op` naming what is missing (a gated_ffn left
  // unsplit, no target or config) or what does not fit the kernels' int constants.
  static FailureOr<KernelInstance> read(Operation* op);

  // Every constant the emitted translation unit depends on, as canonical text.
  std::string key() const;
  // `twell_gate_k2048_n5632_t256_s31_relu_bf16_` + 8 hex digits of a hash of key().
  std::string name() const;
  // Name of the device template and of the header that defines it ("gate_twell", "gated_down").
  const char* templateName() const;
  // Launch geometry: grid.y (number of N tiles for the gate kernel, 1 for the consumer).
  int64_t gridY() const;
  bool isBF16() const { return layout.getValue().isBF16(); }
};

}  // namespace mlir::twell
