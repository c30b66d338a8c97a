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
  bool gated;             // the consumer: twell.gated_down (true) or twell.down (false)
  // The gate kernel's main loop and K step: the gate kernel's own (config) for GateTwell; for the
  // consumer, those of the twell.gate_matmul producing h (whose mainloop must equal the consumer's
  // config's), or, when h has no such producer, the consumer config's mainloop with the K step
  // twell-select-config gives it.
  Mainloop gateMainloop;
  int64_t gateCtaK;

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
  // The consumer variants, named by the config's `consumer` (#twell.config): the token block and one
  // token row per warp (persistent); cta_row otherwise.
  bool isTokenBlock() const;
  bool isWarpRowConsumer() const;
  // Dynamic shared memory per CTA: the mma_sync and wgmma gate kernels' pipeline and epilogue buffer,
  // the token block's ring, the warp-per-row consumer's x rows; 0 for the fma gate kernel and the
  // CTA-per-row consumer (static shared memory only).
  int64_t dynamicSharedBytes() const;
  // The element alignment the kernel needs for the x and w_gate pointers and their row strides:
  // 8 (16 bytes) for the mma_sync gate kernel's cp.async, 2 for a consumer after an mma_sync gate
  // (its recompute reads 4-byte pairs), 1 otherwise.
  int64_t operandAlignment() const;
};

}  // namespace mlir::twell
